// support/lib/safetensors.h — read and write safetensors checkpoints, and the small JSON
// parser their header needs.
//
// The format (github.com/huggingface/safetensors), byte by byte:
//   [8 bytes]  N, the header length, unsigned little-endian
//   [N bytes]  a UTF-8 JSON object: {"__metadata__": {"key": "value", ...},
//              "tensor.name": {"dtype": "F32", "shape": [2, 3],
//                              "data_offsets": [begin, end]}, ...}
//   [rest]     the data: tensor bytes, raw little-endian, row-major; a
//              tensor's bytes are data[begin, end), offsets counted from the
//              first byte after the header.
// __metadata__ is optional and holds only strings. Writers pad the header with
// spaces so the data starts on an 8-byte boundary.
//
// Every function that can fail returns std::string: "" on success, else one
// line naming the file, the problem and the likely fix.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

// ---------------------------------------------------------------------------
// JSON (RFC 8259). Objects keep their keys in file order.
struct Json {
    enum Kind { NUL, BOOL, NUM, STR, ARR, OBJ } kind = NUL;
    bool b = false;
    double num = 0;
    std::string str;
    std::vector<Json> arr;
    std::vector<std::pair<std::string, Json>> obj;
    // The value under key, or nullptr when this is not an object or lacks it.
    const Json* get(const std::string& key) const;
    // Building an object to write: each adds key (replacing its value when the
    // object has it already, so no key is ever written twice) and returns *this.
    Json& add(const std::string& key, const Json& v);
    Json& add_num(const std::string& key, double x);            // NaN and Inf are written as null
    Json& add_str(const std::string& key, const std::string& s);
    Json& add_bool(const std::string& key, bool x);
};

// Parses one JSON value filling the whole text (whitespace aside). Refuses
// nesting deeper than JSON_MAX_DEPTH, more than JSON_MAX_VALUES values, duplicate keys in one object, invalid
// UTF-8, lone surrogates and numbers beyond double range. Error: one line with
// the byte offset. Numbers are read with strtod: C locale assumed (the
// project never calls setlocale).
// More than JSON_MAX_VALUES values is refused before they are held: each
// takes ~100 bytes, so a 100 MB text of [0,0,...] would take 5 GB; 4M values
// (under 0.5 GB) is 50 times what the largest checkpoint header needs.
constexpr int JSON_MAX_DEPTH = 64;
constexpr size_t JSON_MAX_VALUES = (size_t)1 << 22;
std::string json_parse(const std::string& text, Json* out);
std::string json_quote(const std::string& s);   // "..." with the escapes JSON needs
std::string json_dump(const Json& v);           // compact, numbers round-trip exactly
// The one writer of the program's machine-readable output (eval --json, each
// line of log.jsonl, bench --json): json_dump's escaping and numbers, with
// ", " and ": " between fields for a reader's eye. Always valid JSON (a
// non-finite number is null); json_parse reads it back.
std::string json_write(const Json& v);
Json json_of_str(const std::string& s);
Json json_of_num(double x);

// ---------------------------------------------------------------------------
// Reading.
struct StTensor {
    std::string name, dtype;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;   // byte range inside SafeTensors::data
};

struct SafeTensors {
    std::vector<StTensor> tensors;               // in header order
    std::map<std::string, std::string> meta;     // __metadata__
    std::vector<char> data;                      // the bytes after the header
    std::string source;                          // file name, for messages
    const StTensor* find(const std::string& name) const;  // nullptr if absent
};

// Bytes per element of a safetensors dtype ("F32" -> 4), 0 if unknown.
size_t st_dtype_size(const std::string& dtype);

// Parses a whole file held in memory; `what` names it in messages. Checks
// everything a reader relies on (see st_parse_header in the .cpp), so after
// success every tensor's [begin, end) lies inside data and holds exactly
// numel * dtype size bytes. Safe on any input: no crash, and memory bounded
// by a constant times n. On failure *out is left empty.
std::string st_parse(const char* bytes, size_t n, SafeTensors* out, const std::string& what);
// Reads and parses the file at path (the data is read straight into out->data).
std::string st_read(const std::string& path, SafeTensors* out);

// Copies tensor `name` into out (room for its numel elements), after checking
// that it exists with dtype F32 (I32) and exactly this shape. A plain memcpy:
// the host must be little-endian, like the file (checked at compile time).
std::string st_get_f32(const SafeTensors& st, const std::string& name,
                       const std::vector<int64_t>& shape, float* out);
std::string st_get_i32(const SafeTensors& st, const std::string& name,
                       const std::vector<int64_t>& shape, int32_t* out);

// ---------------------------------------------------------------------------
// Writing. StWriter stores pointers, not copies: the data added must stay
// alive and unchanged until st_write returns.
struct StWriter {
    struct Entry {
        std::string name, dtype;
        std::vector<int64_t> shape;
        const void* data = nullptr;
        size_t bytes = 0;
    };
    std::vector<Entry> entries;                  // written in this order
    std::map<std::string, std::string> meta;     // written as __metadata__
    void add(const std::string& name, const std::string& dtype,
             const std::vector<int64_t>& shape, const void* data, size_t bytes);
};

// Validates the entries (known dtype, bytes == numel * dtype size, unique
// names, UTF-8 names and metadata), then writes a new PATH.tmp-XXXXXX beside
// PATH (a unique name created with O_EXCL: a symlink planted there is never
// followed), flushes it to disk and renames it onto PATH: PATH is either the
// old file or the complete new one, never half-written. On failure the tmp
// file is removed and PATH is untouched.
std::string st_write(const std::string& path, const StWriter& w);
// What st_write checks before it writes anything: "" when it would write w.
std::string st_write_check(const std::string& path, const StWriter& w);
// Whether s is valid UTF-8 (what JSON text, and so a header, must be).
bool utf8_valid(const std::string& s);

// FNV-1a 64-bit hash of n bytes: a cheap fingerprint for tensor data.
uint64_t st_checksum(const void* data, size_t n);

// ---------------------------------------------------------------------------
// Opening an input file: the one way every reader of the program opens one
// (checkpoints, text files, ProsQA files). Only a regular file of at most
// max_bytes is opened: a directory, a FIFO (which would block until a writer
// comes), a device (/dev/zero never ends), a socket or a too-large file is
// refused before anything is read, with one line naming the path, what it is
// and the fix. "" and *f (opened "rb"; the caller closes it) with *size, or
// the message (then *f is null).
constexpr uint64_t FILE_MAX_CHECKPOINT = (uint64_t)64 << 30;  // 64 GiB
constexpr uint64_t FILE_MAX_TEXT = (uint64_t)1 << 30;         // 1 GiB (about 5 GB of windows at --seq-len 128)
constexpr uint64_t FILE_MAX_JSON = (uint64_t)256 << 20;       // 256 MiB (the real ProsQA files are under 1 MiB)
std::string file_open_regular(const std::string& path, uint64_t max_bytes, FILE** f, uint64_t* size);
// The whole file through file_open_regular.
std::string file_read_all(const std::string& path, uint64_t max_bytes, std::string* out);
// "SIZE:HASH" (bytes, FNV-1a 64 in hex) of a file's contents: what a
// checkpoint records of the data it was trained on. "" when unreadable.
std::string file_fingerprint(const std::string& path, uint64_t max_bytes);
