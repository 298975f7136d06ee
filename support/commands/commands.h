// support/commands/commands.h — the commands beyond train, eval, sample and
// data, each in its own file of support/commands/, as train.cpp's main calls
// them; the analyses the tests check; and the loading of a trained model
// they share with train.cpp.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "data/task.h"
#include "support/model/lime.h"

int cmd_compare(int argc, char** argv);  // ./lime compare (compare.cpp)
int cmd_analyze(int argc, char** argv);  // ./lime analyze (analyze.cpp)
int cmd_verify(int argc, char** argv);   // ./lime verify (verify.cpp)
int cmd_bench(int argc, char** argv);    // ./lime bench (bench.cpp)
// ./lime verify's checks of reference-vector files, printing nothing (the labs'
// checker runs them as one check): "" when every check of every file passed,
// else how many failed and the first, or why a file could not be checked.
std::string verify_reference_files(const std::vector<std::string>& paths, Device dev, const ModelSettings& settings);

// Router weight by source layer, rows (layers 1..L-1) normalised to sum 1; NaN where no source.
std::vector<std::vector<double>> router_heatmap(const Model& model);
// Entropy of one layer's vectors x (N, T, D) over N sequences, lens[s] real
// positions each, as the paper's authors measure it (analyze.cpp): features
// z-scored over all sequences and positions, Renyi entropy of order alpha of
// each sequence's Gram spectrum; mean and std over the sequences.
struct EntropyStat { double mean = 0, std = 0; };
EntropyStat layer_entropy(const float* x, int N, int T, int D, const std::vector<int>& lens, double alpha);

// Loading a trained model (load.cpp): eval, sample and analyze load it the same
// way, and train --resume checks the same two things. A model with its task:
struct Loaded {
    Model model;
    Task task;
    std::map<std::string, std::string> meta;
    std::string data_changed;  // data_files_changed: printed as a warning by the command
};
// A checkpoint written by train, in a model made for batches of B; with
// need_task its task is rebuilt (test set included), else only its vocabulary.
std::string load_checkpoint(const std::string& path, Device dev, const ModelSettings& settings, int B, Loaded* out,
                            bool need_task);
// The warning load_checkpoint left (data files changed since training), on stderr.
void warn_data_changed(const char* cmd, const Loaded& ld);
// One line when a data file differs from the one the checkpoint was trained on (meta's "data_files"), else "".
std::string data_files_changed(const std::map<std::string, std::string>& meta,
                               const std::map<std::string, std::string>& ts);
// "" when a checkpoint's stored "vocab" is its task's vocabulary token for token, else the line saying not.
std::string vocab_matches(const std::string& path, const std::vector<std::string>& stored, const Vocab& v);
