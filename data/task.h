// data/task.h — the task a run trains on, whichever it is (data/task.cpp).
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "data/prosqa.h"
#include "data/tasks.h"

// A task as a run sees it (data/task.cpp): built from its settings, the
// string map that flags give and that checkpoints store in their metadata
// ("task": {"task": "arith", "ops": "3", ...}), so a checkpoint rebuilds it.

struct Task {
    std::string kind;                       // "arith", "prosqa" or "text"
    ArithData arith;
    ProsqaData prosqa;
    TextData text;
    Vocab vocab;
    const std::vector<Sequence>* train = nullptr;
    const std::vector<Sequence>* test = nullptr;
    int T = 0;                               // positions a model needs
    std::map<std::string, std::string> settings;  // what rebuilds it: stored in checkpoints
};

// "" or one line naming the problem. text_T: window length of the text task.
// mem_bytes > 0: the memory available; data that would need more is refused
// before it is made (0: unchecked). with_train false: the test set alone is
// wanted (eval, analyze, data --split test): ProsQA then generates no training
// item (its test set and vocabulary come from the test file; T is the test
// set's longest), the other tasks build both as ever.
std::string task_build(const std::map<std::string, std::string>& settings, int text_T, Task* t,
                       uint64_t mem_bytes = 0, bool with_train = true);
// A data file's path as task_build opens it: a relative path that does not
// exist from the current directory is looked up in the program's own
// directory or the one above it (where the repository's data/ is), so the default
// data/prosqa/prosqa_test.json is found from anywhere.
std::string task_data_path(const std::string& path);
// The data files a task reads ("text-file", "prosqa-test"), resolved: key -> path.
std::map<std::string, std::string> task_data_files(const std::map<std::string, std::string>& settings);
std::string settings_to_json(const std::map<std::string, std::string>& s);
std::string settings_from_json(const std::string& text, std::map<std::string, std::string>* s);
std::string vocab_to_json(const Vocab& v);  // the token strings in id order, a JSON list
