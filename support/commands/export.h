// support/commands/export.h — a LLaMa checkpoint as a Hugging Face transformers model
// directory (./lime export): config.json, model.safetensors,
// generation_config.json and a tokenizer that gives the ids the trainer used
// (support/commands/export.cpp; docs/checkpoint.md says what each file holds).
#pragma once
#include <map>
#include <string>
#include <vector>

#include "support/model/lime.h"

// The files an export writes besides model.safetensors, name -> contents,
// from the model's config, its task ("arith", "prosqa" or "text") and its
// vocabulary (the token strings in id order, as the checkpoint stores them).
// "" or one line naming what in the vocabulary a tokenizer cannot hold.
std::string hf_json_files(const Config& c, const std::string& task, const std::vector<std::string>& vocab,
                          std::map<std::string, std::string>* files);

// Exports the llama checkpoint at `path` into directory `out`: everything is
// written into a temporary directory beside it, then renamed into place.
// An `out` that exists and holds files is refused unless force (then the
// export's files replace those of the same names, the others stay). "" or one
// line naming the problem and the fix; on failure nothing is left behind.
std::string hf_export(const std::string& path, const std::string& out, bool force);
