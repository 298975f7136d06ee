// data/task.h — the task a run trains on, whichever it is (data/task.cpp).
#pragma once
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
std::string task_build(const std::map<std::string, std::string>& settings, int text_T, Task* t);
std::string settings_to_json(const std::map<std::string, std::string>& s);
std::string settings_from_json(const std::string& text, std::map<std::string, std::string>* s);
std::string vocab_to_json(const Vocab& v);  // the token strings in id order, a JSON list
