// tests/json_check.cpp — the shell suites' JSON reader (build/json_check):
// parses what a command printed with support/lib/safetensors.cpp's json_parse,
// the reader the program itself trusts.
//   json_check [--lines] [KEY...] < text
// The whole of stdin (--lines: each non-empty line) must be one JSON value,
// else one line naming the problem and exit 1. Each KEY (a path of object
// keys joined by '>', e.g. "runs/a/model.safetensors>accuracy") then prints the value
// there, json_dump'ed, one a line, from the last value read; a missing key exits 1.
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "support/lib/safetensors.h"

int main(int argc, char** argv) {
    bool lines = false;
    std::vector<std::string> keys;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--lines") lines = true;
        else keys.push_back(a);
    }
    std::stringstream ss;
    ss << std::cin.rdbuf();
    std::string text = ss.str();
    std::vector<std::string> docs;
    if (!lines) docs.push_back(text);
    else {
        std::string line;
        std::istringstream in(text);
        while (std::getline(in, line)) if (!line.empty()) docs.push_back(line);
    }
    if (docs.empty()) { printf("json_check: no input\n"); return 1; }
    Json j;
    for (size_t i = 0; i < docs.size(); i++) {
        std::string err = json_parse(docs[i], &j);
        if (!err.empty()) { printf("json_check: %s %zu is not valid JSON: %s\n", lines ? "line" : "text", i + 1, err.c_str()); return 1; }
    }
    for (const std::string& key : keys) {
        const Json* v = &j;
        size_t at = 0;
        while (v && at <= key.size()) {
            size_t end = key.find('>', at);
            if (end == std::string::npos) end = key.size();
            v = v->get(key.substr(at, end - at));
            at = end + 1;
        }
        if (!v) { printf("json_check: no key %s\n", key.c_str()); return 1; }
        printf("%s\n", json_dump(*v).c_str());
    }
    return 0;
}
