// support/lib/safetensors.cpp — see support/lib/safetensors.h for the format. Three parts: a JSON
// parser and writer (the header is JSON), the reader with its validation, and
// the atomic writer.
#include "support/lib/safetensors.h"
#include "support/lib/cli.h"  // open_temp_beside

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include <fcntl.h>      // open, for fsync of the directory
#include <sys/stat.h>   // fstat
#include <unistd.h>     // fsync, close

// Tensor bytes are copied as they are, so host and file must agree on byte
// order. (Header lengths are decoded byte by byte and need no such luck.)
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.cpp copies little-endian tensor data with memcpy: it needs a little-endian host"
#endif

// ===========================================================================
// JSON

const Json* Json::get(const std::string& key) const {
    if (kind != OBJ) return nullptr;
    for (const auto& kv : obj)
        if (kv.first == key) return &kv.second;
    return nullptr;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Length of the UTF-8 sequence starting at s (1 to 4 bytes), or 0 if it is
// not a valid encoding of a character: truncated, overlong, a surrogate, or
// beyond U+10FFFF. RFC 8259 requires UTF-8 text.
static size_t utf8_length(const unsigned char* s, const unsigned char* end) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t n;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF)      { n = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; cp = c & 0x07; }
    else return 0;  // a continuation byte, or a lead byte no valid character has
    if ((size_t)(end - s) < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (n == 3 && cp < 0x800) return 0;
    if (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) return 0;
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
    return n;
}

bool utf8_valid(const std::string& s) {
    const unsigned char* p = (const unsigned char*)s.data();
    const unsigned char* end = p + s.size();
    while (p < end) {
        size_t n = utf8_length(p, end);
        if (n == 0) return false;
        p += n;
    }
    return true;
}

static void append_utf8(std::string* out, uint32_t cp) {
    if (cp < 0x80) {
        out->push_back((char)cp);
    } else if (cp < 0x800) {
        out->push_back((char)(0xC0 | (cp >> 6)));
        out->push_back((char)(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out->push_back((char)(0xE0 | (cp >> 12)));
        out->push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
        out->push_back((char)(0x80 | (cp & 0x3F)));
    } else {
        out->push_back((char)(0xF0 | (cp >> 18)));
        out->push_back((char)(0x80 | ((cp >> 12) & 0x3F)));
        out->push_back((char)(0x80 | ((cp >> 6) & 0x3F)));
        out->push_back((char)(0x80 | (cp & 0x3F)));
    }
}

// A key for an error message: quoted, and cut short if long, so that a
// corrupt header cannot make the message itself huge.
static std::string short_quote(const std::string& s) {
    if (s.size() <= 60) return json_quote(s);
    return json_quote(s.substr(0, 60)) + "...";
}

// A value for an error message, cut short if long.
static std::string short_dump(const Json& v);

namespace {

// Recursive descent over [begin, end). Each function consumes one grammar
// element from p and returns false after recording the first error.
struct JsonParser {
    const char* begin;
    const char* p;
    const char* end;
    std::string err;
    size_t values = 0;  // parsed so far: at most JSON_MAX_VALUES

    bool fail(const std::string& what) {
        if (err.empty()) err = what + " at byte " + std::to_string(p - begin);
        return false;
    }
    void skip_ws() {
        while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) p++;
    }

    bool value(Json* out, int depth) {
        skip_ws();
        if (p == end) return fail("unexpected end of text, expected a value");
        if (++values > JSON_MAX_VALUES)  // each value costs ~100 bytes held: [0,0,...] would take 50x the text
            return fail("more than " + std::to_string(JSON_MAX_VALUES) + " values");
        switch (*p) {
            case '{': return object(out, depth + 1);
            case '[': return array(out, depth + 1);
            case '"': out->kind = Json::STR; return string(&out->str);
            case 't': return literal("true", out, Json::BOOL, true);
            case 'f': return literal("false", out, Json::BOOL, false);
            case 'n': return literal("null", out, Json::NUL, false);
            default:
                if (*p == '-' || is_digit(*p)) return number(out);
                return fail("unexpected character, expected a value");
        }
    }

    bool literal(const char* word, Json* out, Json::Kind kind, bool b) {
        size_t n = strlen(word);
        if ((size_t)(end - p) < n || memcmp(p, word, n) != 0)
            return fail(std::string("expected '") + word + "'");
        p += n;
        out->kind = kind;
        out->b = b;
        return true;
    }

    // RFC 8259 grammar: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
    // checked here; strtod then converts exactly the text we accepted.
    bool number(Json* out) {
        const char* start = p;
        if (*p == '-') p++;
        if (p == end || !is_digit(*p)) return fail("expected a digit");
        if (*p == '0') p++;
        else while (p < end && is_digit(*p)) p++;
        if (p < end && *p == '.') {
            p++;
            if (p == end || !is_digit(*p)) return fail("expected a digit after '.'");
            while (p < end && is_digit(*p)) p++;
        }
        if (p < end && (*p == 'e' || *p == 'E')) {
            p++;
            if (p < end && (*p == '+' || *p == '-')) p++;
            if (p == end || !is_digit(*p)) return fail("expected a digit in the exponent");
            while (p < end && is_digit(*p)) p++;
        }
        // A copy, so strtod cannot read past what the grammar accepted.
        std::string text(start, p);
        double x = strtod(text.c_str(), nullptr);
        if (!std::isfinite(x)) { p = start; return fail("number out of range"); }
        out->kind = Json::NUM;
        out->num = x;
        return true;
    }

    bool hex4(uint32_t* out) {
        if (end - p < 4) return fail("truncated \\u escape");
        uint32_t v = 0;
        for (int i = 0; i < 4; i++, p++) {
            char c = *p;
            int d = is_digit(c) ? c - '0' : (c >= 'a' && c <= 'f') ? c - 'a' + 10
                  : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
            if (d < 0) return fail("expected 4 hex digits after \\u");
            v = v * 16 + (uint32_t)d;
        }
        *out = v;
        return true;
    }

    // \uXXXX; characters beyond U+FFFF come as a UTF-16 surrogate pair.
    bool unicode_escape(std::string* out) {
        uint32_t cp = 0;
        if (!hex4(&cp)) return false;
        if (cp >= 0xDC00 && cp <= 0xDFFF) return fail("lone low surrogate in \\u escape");
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (end - p < 2 || p[0] != '\\' || p[1] != 'u')
                return fail("high surrogate not followed by a \\u low surrogate");
            p += 2;
            uint32_t lo = 0;
            if (!hex4(&lo)) return false;
            if (lo < 0xDC00 || lo > 0xDFFF)
                return fail("high surrogate not followed by a low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        append_utf8(out, cp);
        return true;
    }

    bool escape(std::string* out) {
        p++;  // the backslash
        if (p == end) return fail("unterminated escape");
        char e = *p++;
        switch (e) {
            case '"': out->push_back('"'); return true;
            case '\\': out->push_back('\\'); return true;
            case '/': out->push_back('/'); return true;
            case 'b': out->push_back('\b'); return true;
            case 'f': out->push_back('\f'); return true;
            case 'n': out->push_back('\n'); return true;
            case 'r': out->push_back('\r'); return true;
            case 't': out->push_back('\t'); return true;
            case 'u': return unicode_escape(out);
            default: p--; return fail("unknown escape");
        }
    }

    bool string(std::string* out) {
        p++;  // the opening quote
        for (;;) {
            if (p == end) return fail("unterminated string");
            unsigned char c = (unsigned char)*p;
            if (c == '"') { p++; return true; }
            if (c == '\\') {
                if (!escape(out)) return false;
                continue;
            }
            if (c < 0x20) return fail("unescaped control character in a string");
            size_t n = utf8_length((const unsigned char*)p, (const unsigned char*)end);
            if (n == 0) return fail("invalid UTF-8 in a string");
            out->append(p, n);
            p += n;
        }
    }

    bool array(Json* out, int depth) {
        if (depth > JSON_MAX_DEPTH)
            return fail("nesting deeper than " + std::to_string(JSON_MAX_DEPTH));
        p++;  // '['
        out->kind = Json::ARR;
        skip_ws();
        if (p < end && *p == ']') { p++; return true; }
        for (;;) {
            out->arr.emplace_back();
            if (!value(&out->arr.back(), depth)) return false;
            skip_ws();
            if (p == end) return fail("unexpected end of text in an array");
            if (*p == ']') { p++; return true; }
            if (*p != ',') return fail("expected ',' or ']'");
            p++;
        }
    }

    bool object(Json* out, int depth) {
        if (depth > JSON_MAX_DEPTH)
            return fail("nesting deeper than " + std::to_string(JSON_MAX_DEPTH));
        p++;  // '{'
        out->kind = Json::OBJ;
        std::set<std::string> seen;  // duplicate keys: refused, RFC 8259 leaves them undefined
        skip_ws();
        if (p < end && *p == '}') { p++; return true; }
        for (;;) {
            skip_ws();
            if (p == end) return fail("unexpected end of text in an object");
            if (*p != '"') return fail("expected a string key");
            const char* key_at = p;
            std::string key;
            if (!string(&key)) return false;
            if (!seen.insert(key).second) {
                p = key_at;
                return fail("duplicate key " + short_quote(key));
            }
            skip_ws();
            if (p == end || *p != ':') return fail("expected ':' after a key");
            p++;
            out->obj.emplace_back(std::move(key), Json());
            if (!value(&out->obj.back().second, depth)) return false;
            skip_ws();
            if (p == end) return fail("unexpected end of text in an object");
            if (*p == '}') { p++; return true; }
            if (*p != ',') return fail("expected ',' or '}'");
            p++;
        }
    }
};

}  // namespace

std::string json_parse(const std::string& text, Json* out) {
    *out = Json();
    JsonParser ps{text.data(), text.data(), text.data() + text.size(), "", 0};
    if (ps.value(out, 0)) {
        ps.skip_ws();
        if (ps.p == ps.end) return "";
        ps.fail("trailing characters after the value");
    }
    *out = Json();
    return ps.err;
}

std::string json_quote(const std::string& s) {
    std::string r = "\"";
    for (unsigned char c : s) {
        switch (c) {
            case '"': r += "\\\""; break;
            case '\\': r += "\\\\"; break;
            case '\b': r += "\\b"; break;
            case '\f': r += "\\f"; break;
            case '\n': r += "\\n"; break;
            case '\r': r += "\\r"; break;
            case '\t': r += "\\t"; break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    snprintf(buf, sizeof buf, "\\u%04x", c);
                    r += buf;
                } else {
                    r += (char)c;  // UTF-8 passes through as it is
                }
        }
    }
    return r + "\"";
}

// Integers print as integers; other numbers with the fewest digits (15 to 17)
// that read back to the same double.
static std::string dump_number(double x) {
    if (!std::isfinite(x)) return "null";  // JSON has no inf or nan
    char buf[32];
    if (x == std::floor(x) && std::fabs(x) < 1e15) {
        snprintf(buf, sizeof buf, "%.0f", x);
        return buf;
    }
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, x);
        if (strtod(buf, nullptr) == x) break;
    }
    return buf;
}

// json_write's numbers: a value that is a float (a loss, a learning rate) with
// the fewest digits that give back that float, so that the log reads 2.8176825
// rather than 2.8176825046539307; any other as dump_number.
static std::string write_number(double x) {
    if (!std::isfinite(x) || x == std::floor(x) || (double)(float)x != x) return dump_number(x);
    char buf[32];
    for (int digits = 6; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, x);
        if (strtof(buf, nullptr) == (float)x) break;
    }
    return buf;
}

static void dump_into(const Json& v, std::string* out, bool spaced = false) {
    const char* comma = spaced ? ", " : ",";
    const char* colon = spaced ? ": " : ":";
    switch (v.kind) {
        case Json::NUL: *out += "null"; break;
        case Json::BOOL: *out += v.b ? "true" : "false"; break;
        case Json::NUM: *out += spaced ? write_number(v.num) : dump_number(v.num); break;
        case Json::STR: *out += json_quote(v.str); break;
        case Json::ARR:
            *out += '[';
            for (size_t i = 0; i < v.arr.size(); i++) {
                if (i) *out += comma;
                dump_into(v.arr[i], out, spaced);
            }
            *out += ']';
            break;
        case Json::OBJ:
            *out += '{';
            for (size_t i = 0; i < v.obj.size(); i++) {
                if (i) *out += comma;
                *out += json_quote(v.obj[i].first);
                *out += colon;
                dump_into(v.obj[i].second, out, spaced);
            }
            *out += '}';
            break;
    }
}

std::string json_dump(const Json& v) {
    std::string out;
    dump_into(v, &out);
    return out;
}

std::string json_write(const Json& v) {
    std::string out;
    dump_into(v, &out, true);
    return out;
}

Json json_of_str(const std::string& s) {
    Json j;
    j.kind = Json::STR;
    j.str = s;
    return j;
}
Json json_of_num(double x) {
    Json j;
    j.kind = Json::NUM;
    j.num = x;
    return j;
}

Json& Json::add(const std::string& key, const Json& v) {
    if (kind != OBJ) *this = Json(), kind = OBJ;
    for (auto& kv : obj)
        if (kv.first == key) { kv.second = v; return *this; }
    obj.emplace_back(key, v);
    return *this;
}
Json& Json::add_num(const std::string& key, double x) { return add(key, json_of_num(x)); }
Json& Json::add_str(const std::string& key, const std::string& s) { return add(key, json_of_str(s)); }
Json& Json::add_bool(const std::string& key, bool x) {
    Json j;
    j.kind = BOOL;
    j.b = x;
    return add(key, j);
}

static std::string short_dump(const Json& v) {
    std::string s = json_dump(v);
    return s.size() <= 60 ? s : s.substr(0, 60) + "...";
}

// ===========================================================================
// Reading

// The reference implementation's limit: a header is metadata, never data.
static const uint64_t HEADER_MAX = 100000000;
// Dims and offsets must be integers a double holds exactly.
static const double INDEX_MAX = 9007199254740992.0;  // 2^53

struct DtypeSize { const char* name; size_t size; };
static const DtypeSize DTYPES[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F8_E5M2", 1}, {"F8_E4M3", 1},
    {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
    {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1},
};

size_t st_dtype_size(const std::string& dtype) {
    for (const DtypeSize& d : DTYPES)
        if (dtype == d.name) return d.size;
    return 0;
}

const StTensor* SafeTensors::find(const std::string& name) const {
    for (const StTensor& t : tensors)  // linear: a model has hundreds, not millions
        if (t.name == name) return &t;
    return nullptr;
}

static std::string shape_str(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

// "what: problem (fix)" — the one-line form of every error here.
static std::string problem(const std::string& what, const std::string& msg, const std::string& fix) {
    return what + ": " + msg + " (" + fix + ")";
}

// Product of the dims times the element size, false on overflow or a
// negative dim. Zero dims are looked for first: [0, huge, huge] is empty.
static bool byte_count(const std::vector<int64_t>& shape, size_t elem, uint64_t* bytes) {
    for (int64_t d : shape)
        if (d < 0) return false;
    for (int64_t d : shape)
        if (d == 0) { *bytes = 0; return true; }
    uint64_t n = elem;
    for (int64_t d : shape) {
        if (n > UINT64_MAX / (uint64_t)d) return false;
        n *= (uint64_t)d;
    }
    *bytes = n;
    return true;
}

// A JSON number that is a non-negative integer below 2^53.
static bool as_index(const Json& v, uint64_t* out) {
    if (v.kind != Json::NUM || !(v.num >= 0) || v.num >= INDEX_MAX || v.num != std::floor(v.num))
        return false;
    *out = (uint64_t)v.num;
    return true;
}

static uint64_t read_u64_le(const char* b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | (unsigned char)b[i];
    return v;
}

// The 8-byte prefix: reads the header length and checks it against the file.
// `first` holds min(8, total) bytes.
static std::string check_prefix(const char* first, uint64_t total, uint64_t* hlen,
                                const std::string& what) {
    const std::string nst = "not a safetensors file: ";
    if (total == 0) return problem(what, nst + "the file is empty", "was it written completely?");
    if (total < 8)
        return problem(what, nst + "only " + std::to_string(total) +
                       " bytes, fewer than the 8-byte header length", "truncated file?");
    *hlen = read_u64_le(first);
    if (*hlen == 0) return problem(what, nst + "header length is 0", "corrupt file?");
    if (*hlen > HEADER_MAX)
        return problem(what, nst + "header length " + std::to_string(*hlen) + " exceeds the " +
                       std::to_string(HEADER_MAX) + "-byte limit", "corrupt, or not a checkpoint?");
    if (*hlen > total - 8)
        return problem(what, nst + "header length " + std::to_string(*hlen) +
                       " exceeds the file size " + std::to_string(total),
                       "truncated or not a checkpoint?");
    return "";
}

static std::string parse_metadata(const Json& v, SafeTensors* st, const std::string& what) {
    const std::string fix = "metadata values must be strings: store structured values JSON-encoded";
    if (v.kind != Json::OBJ) return problem(what, "__metadata__ is not a JSON object", fix);
    for (const auto& kv : v.obj) {
        if (kv.second.kind != Json::STR)
            return problem(what, "__metadata__ entry " + short_quote(kv.first) + " is not a string", fix);
        st->meta[kv.first] = kv.second.str;
    }
    return "";
}

// One tensor entry: {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]}.
// Other keys are ignored, as the reference implementation does.
static std::string parse_tensor(const std::string& name, const Json& v, uint64_t data_size,
                                StTensor* t, const std::string& what) {
    const std::string tn = "tensor " + short_quote(name) + ": ";
    const std::string fix = "corrupt header?";
    t->name = name;
    if (v.kind != Json::OBJ) return problem(what, tn + "entry is not a JSON object", fix);

    const Json* dtype = v.get("dtype");
    if (!dtype || dtype->kind != Json::STR)
        return problem(what, tn + "\"dtype\" missing or not a string", fix);
    t->dtype = dtype->str;
    size_t elem = st_dtype_size(t->dtype);
    if (elem == 0)
        return problem(what, tn + "unknown dtype " + short_quote(t->dtype),
                       "known: F64 F32 F16 BF16 F8_E5M2 F8_E4M3 I64 I32 I16 I8 U64 U32 U16 U8 BOOL");

    const Json* shape = v.get("shape");
    if (!shape || shape->kind != Json::ARR)
        return problem(what, tn + "\"shape\" missing or not an array", fix);
    for (const Json& d : shape->arr) {
        uint64_t dim;
        if (!as_index(d, &dim))
            return problem(what, tn + "dimension " + short_dump(d) +
                           " is not a non-negative integer below 2^53", fix);
        t->shape.push_back((int64_t)dim);
    }
    uint64_t bytes;
    if (!byte_count(t->shape, elem, &bytes))
        return problem(what, tn + "shape " + shape_str(t->shape) + " has too many elements", fix);

    const Json* off = v.get("data_offsets");
    if (!off || off->kind != Json::ARR || off->arr.size() != 2 ||
        !as_index(off->arr[0], &t->begin) || !as_index(off->arr[1], &t->end))
        return problem(what, tn + "\"data_offsets\" missing or not [begin, end] of two non-negative integers", fix);
    const std::string range = "[" + std::to_string(t->begin) + ", " + std::to_string(t->end) + "]";
    if (t->begin > t->end)
        return problem(what, tn + "data_offsets " + range + " end before they begin", fix);
    if (t->end > data_size)
        return problem(what, tn + "data_offsets " + range + " reach beyond the " +
                       std::to_string(data_size) + " data bytes", "truncated file?");
    if (t->end - t->begin != bytes)
        return problem(what, tn + "data_offsets " + range + " hold " + std::to_string(t->end - t->begin) +
                       " bytes but dtype " + t->dtype + " and shape " + shape_str(t->shape) +
                       " need " + std::to_string(bytes) + ": size mismatch", fix);
    return "";
}

// Two tensors sharing bytes would alias each other; a writer never does that.
// Sorted by begin, each non-empty tensor must start at or after the previous end.
static std::string check_overlaps(const std::vector<StTensor>& tensors, const std::string& what) {
    std::vector<const StTensor*> order;
    for (const StTensor& t : tensors)
        if (t.end > t.begin) order.push_back(&t);
    std::sort(order.begin(), order.end(),
              [](const StTensor* a, const StTensor* b) { return a->begin < b->begin; });
    for (size_t i = 1; i < order.size(); i++)
        if (order[i]->begin < order[i - 1]->end)
            return problem(what, "tensors " + short_quote(order[i - 1]->name) + " and " +
                           short_quote(order[i]->name) + " overlap in the data", "corrupt header?");
    return "";
}

// Everything the header must satisfy. Duplicate tensor names need no check
// of their own: json_parse refuses duplicate keys.
static std::string parse_header(const std::string& text, uint64_t data_size, SafeTensors* st,
                                const std::string& what) {
    Json root;
    std::string err = json_parse(text, &root);
    if (!err.empty())
        return problem(what, "header is not valid JSON: " + err + " of the header",
                       "corrupt file, or not a safetensors file?");
    if (root.kind != Json::OBJ)
        return problem(what, "header is not a JSON object", "corrupt file, or not a safetensors file?");
    for (const auto& kv : root.obj) {
        if (kv.first == "__metadata__") {
            err = parse_metadata(kv.second, st, what);
        } else {
            st->tensors.emplace_back();
            err = parse_tensor(kv.first, kv.second, data_size, &st->tensors.back(), what);
        }
        if (!err.empty()) return err;
    }
    return check_overlaps(st->tensors, what);
}

std::string st_parse(const char* bytes, size_t n, SafeTensors* out, const std::string& what) {
    *out = SafeTensors();
    uint64_t hlen = 0;
    std::string err = check_prefix(bytes, n, &hlen, what);
    if (!err.empty()) return err;
    SafeTensors st;
    st.source = what;
    err = parse_header(std::string(bytes + 8, hlen), n - 8 - hlen, &st, what);
    if (!err.empty()) return err;
    st.data.assign(bytes + 8 + hlen, bytes + n);
    *out = std::move(st);
    return "";
}

static bool read_exactly(FILE* f, void* buf, size_t n) {
    return n == 0 || fread(buf, 1, n, f) == n;
}

// Same checks as st_parse, but the data goes straight from the file into
// out->data: a large checkpoint is not held twice.
static std::string read_file(FILE* f, const std::string& path, SafeTensors* out) {
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0)
        return problem(path, std::string("cannot stat: ") + strerror(errno), "is it readable?");
    if (!S_ISREG(sb.st_mode)) return problem(path, "not a regular file", "is it a directory?");
    uint64_t total = (uint64_t)sb.st_size;

    char first[8] = {0};
    const std::string short_read = "read failed or the file changed while being read";
    if (!read_exactly(f, first, total < 8 ? (size_t)total : 8))
        return problem(path, short_read, "is another process writing it?");
    uint64_t hlen = 0;
    std::string err = check_prefix(first, total, &hlen, path);
    if (!err.empty()) return err;

    std::string header(hlen, '\0');
    if (!read_exactly(f, &header[0], hlen)) return problem(path, short_read, "is another process writing it?");
    SafeTensors st;
    st.source = path;
    err = parse_header(header, total - 8 - hlen, &st, path);
    if (!err.empty()) return err;
    st.data.resize(total - 8 - hlen);
    if (!read_exactly(f, st.data.data(), st.data.size()))
        return problem(path, short_read, "is another process writing it?");
    *out = std::move(st);
    return "";
}

std::string st_read(const std::string& path, SafeTensors* out) {
    *out = SafeTensors();
    FILE* f = nullptr;
    uint64_t size = 0;
    std::string err = file_open_regular(path, FILE_MAX_CHECKPOINT, &f, &size);
    if (!err.empty()) return err;
    err = read_file(f, path, out);
    fclose(f);
    return err;
}

static std::string st_get(const SafeTensors& st, const std::string& name, const char* dtype,
                          const std::vector<int64_t>& shape, void* out) {
    const std::string what = st.source.empty() ? "safetensors" : st.source;
    const StTensor* t = st.find(name);
    if (!t)
        return problem(what, "tensor " + short_quote(name) + " not found",
                       "a checkpoint of another architecture or config?");
    if (t->dtype != dtype)
        return problem(what, "tensor " + short_quote(name) + " has dtype " + t->dtype +
                       ", expected " + dtype, "convert the checkpoint to " + std::string(dtype));
    if (t->shape != shape)
        return problem(what, "tensor " + short_quote(name) + " has shape " + shape_str(t->shape) +
                       ", expected " + shape_str(shape), "a checkpoint of another config?");
    // st_parse guarantees this; a hand-built SafeTensors might not.
    uint64_t bytes;
    if (!byte_count(shape, st_dtype_size(dtype), &bytes) || t->begin > t->end ||
        t->end > st.data.size() || t->end - t->begin != bytes)
        return problem(what, "tensor " + short_quote(name) + " has a byte range that does not fit the data",
                       "a SafeTensors not made by st_parse?");
    if (bytes) memcpy(out, st.data.data() + t->begin, bytes);
    return "";
}

std::string st_get_f32(const SafeTensors& st, const std::string& name,
                       const std::vector<int64_t>& shape, float* out) {
    return st_get(st, name, "F32", shape, out);
}

std::string st_get_i32(const SafeTensors& st, const std::string& name,
                       const std::vector<int64_t>& shape, int32_t* out) {
    return st_get(st, name, "I32", shape, out);
}

// ===========================================================================
// Writing

void StWriter::add(const std::string& name, const std::string& dtype,
                   const std::vector<int64_t>& shape, const void* data, size_t bytes) {
    entries.push_back(Entry{name, dtype, shape, data, bytes});
}

// Refuses what st_parse would refuse on reading, so that st_write never
// produces a file this reader cannot load. These are caller bugs.
static std::string check_entries(const StWriter& w, const std::string& path) {
    const std::string fix = "a bug in the caller";
    std::set<std::string> names;
    for (const StWriter::Entry& e : w.entries) {
        const std::string tn = "cannot write tensor " + short_quote(e.name) + ": ";
        if (e.name == "__metadata__" || !utf8_valid(e.name))
            return problem(path, tn + "the name is reserved or not UTF-8", fix);
        if (!names.insert(e.name).second) return problem(path, tn + "duplicate name", fix);
        size_t elem = st_dtype_size(e.dtype);
        if (elem == 0) return problem(path, tn + "unknown dtype " + short_quote(e.dtype), fix);
        uint64_t bytes;
        bool dims_ok = std::all_of(e.shape.begin(), e.shape.end(),
                                   [](int64_t d) { return d >= 0 && (double)d < INDEX_MAX; });
        if (!dims_ok || !byte_count(e.shape, elem, &bytes))
            return problem(path, tn + "bad shape " + shape_str(e.shape), fix);
        if (bytes != e.bytes)
            return problem(path, tn + "got " + std::to_string(e.bytes) + " bytes but dtype " + e.dtype +
                           " and shape " + shape_str(e.shape) + " need " + std::to_string(bytes), fix);
        if (bytes && !e.data) return problem(path, tn + "null data", fix);
    }
    for (const auto& kv : w.meta)
        if (!utf8_valid(kv.first) || !utf8_valid(kv.second))
            return problem(path, "metadata " + short_quote(kv.first) + " is not UTF-8", fix);
    return "";
}

// __metadata__ first, then the tensors in insertion order with contiguous
// offsets; spaces pad it so the data starts at a multiple of 8 bytes.
static std::string make_header(const StWriter& w) {
    std::string h = "{";
    if (!w.meta.empty()) {
        h += "\"__metadata__\":{";
        bool first = true;
        for (const auto& kv : w.meta) {
            if (!first) h += ',';
            first = false;
            h += json_quote(kv.first) + ":" + json_quote(kv.second);
        }
        h += "}";
    }
    uint64_t offset = 0;
    for (const StWriter::Entry& e : w.entries) {
        if (h.size() > 1) h += ',';
        h += json_quote(e.name) + ":{\"dtype\":" + json_quote(e.dtype) + ",\"shape\":[";
        for (size_t i = 0; i < e.shape.size(); i++) h += (i ? "," : "") + std::to_string(e.shape[i]);
        h += "],\"data_offsets\":[" + std::to_string(offset) + "," + std::to_string(offset + e.bytes) + "]}";
        offset += e.bytes;
    }
    h += "}";
    while (h.size() % 8) h += ' ';
    return h;
}

// Fault injection for tests/test_faults.sh, compiled only into testing builds
// (LIME_TESTING: ./lime-emu, build/lime-asan; never ./lime):
// LIME_TEST_SLOW_SAVE=US flushes and sleeps US microseconds after each tensor,
// so that a test can kill the writer at many moments while the file is
// half-written. Unset, or in ./lime: nothing.
static void test_slow_save(FILE* f) {
#ifdef LIME_TESTING
    static const char* us = getenv("LIME_TEST_SLOW_SAVE");
    if (us) {
        fflush(f);
        usleep((useconds_t)atoi(us));
    }
#else
    (void)f;
#endif
}

// Writes the whole file to a new tmp beside path (open_temp_beside: a unique
// name, O_EXCL, so a symlink or a file planted there is never followed or
// overwritten) and forces it to disk. Removes tmp on failure, but only once
// this function has created it.
static std::string write_tmp(const std::string& path, std::string* tmp, const std::string& header, const StWriter& w) {
    int fd = open_temp_beside(path, tmp);
    FILE* f = fd < 0 ? nullptr : fdopen(fd, "wb");
    if (!f) {
        int e = errno;
        if (fd >= 0) { close(fd); unlink(tmp->c_str()); }
        return "cannot write " + path + ".tmp-XXXXXX: " + strerror(e) + " (" + errno_hint(e) + ")";
    }
    char len8[8];
    uint64_t n = header.size();
    for (int i = 0; i < 8; i++) len8[i] = (char)(n >> (8 * i));  // little-endian
    bool ok = fwrite(len8, 1, 8, f) == 8 && fwrite(header.data(), 1, header.size(), f) == header.size();
    for (const StWriter::Entry& e : w.entries) {
        ok = ok && (e.bytes == 0 || fwrite(e.data, 1, e.bytes, f) == e.bytes);
        test_slow_save(f);
    }
    // fflush hands the bytes to the OS, fsync makes the OS put them on disk:
    // without it a crash after the rename could leave PATH empty.
    ok = ok && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int e = errno;
    if (fclose(f) != 0 && ok) { ok = false; e = errno; }
    if (ok) return "";
    unlink(tmp->c_str());
    return "cannot write " + *tmp + ": " + strerror(e) + " (" + errno_hint(e) + ")";
}

// Makes the rename itself durable. Best effort: some file systems refuse to
// fsync a directory, and the file is complete either way.
static void sync_directory(const std::string& path) {
    size_t slash = path.rfind('/');
    std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
    int fd = open(dir.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    (void)fsync(fd);
    close(fd);
}

std::string st_write_check(const std::string& path, const StWriter& w) {
    std::string err = check_entries(w, path);
    if (!err.empty()) return err;
    std::string header = make_header(w);
    if (header.size() > HEADER_MAX)
        return problem(path, "header of " + std::to_string(header.size()) + " bytes exceeds the " +
                       std::to_string(HEADER_MAX) + "-byte limit", "too much metadata?");
    return "";
}

std::string st_write(const std::string& path, const StWriter& w) {
    std::string err = st_write_check(path, w);
    if (!err.empty()) return err;
    std::string header = make_header(w), tmp;
    err = write_tmp(path, &tmp, header, w);
    if (!err.empty()) return err;
    // rename() replaces PATH atomically: readers see the old file or the new one.
    if (rename(tmp.c_str(), path.c_str()) != 0) {
        int e = errno;
        unlink(tmp.c_str());
        return "cannot rename " + tmp + " onto " + path + ": " + strerror(e) + " (" + errno_hint(e) + ")";
    }
    sync_directory(path);
    return "";
}

uint64_t st_checksum(const void* data, size_t n) {
    const unsigned char* p = (const unsigned char*)data;
    uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a 64: offset basis and prime
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}

// ===========================================================================
// Opening input files

static std::string size_str(uint64_t bytes) {
    char buf[64];
    if (bytes >= ((uint64_t)1 << 30)) snprintf(buf, sizeof buf, "%.1f GiB", (double)bytes / (double)((uint64_t)1 << 30));
    else if (bytes >= ((uint64_t)1 << 20)) snprintf(buf, sizeof buf, "%.1f MiB", (double)bytes / (double)((uint64_t)1 << 20));
    else snprintf(buf, sizeof buf, "%llu bytes", (unsigned long long)bytes);
    return buf;
}

// What a non-regular file is, for the message.
static const char* file_kind(mode_t m) {
    return S_ISDIR(m) ? "a directory" : S_ISFIFO(m) ? "a FIFO (named pipe)" : S_ISCHR(m) ? "a character device"
         : S_ISBLK(m) ? "a block device" : S_ISSOCK(m) ? "a socket" : "not a regular file";
}

static std::string check_regular(const std::string& path, const struct stat& sb, uint64_t max_bytes) {
    if (!S_ISREG(sb.st_mode))
        return "'" + path + "' is " + file_kind(sb.st_mode) + ", not a regular file (give the path of a file)";
    if ((uint64_t)sb.st_size > max_bytes)
        return "'" + path + "' is " + size_str((uint64_t)sb.st_size) + ", more than the " + size_str(max_bytes) +
               " this reader accepts (give a smaller file)";
    return "";
}

std::string file_open_regular(const std::string& path, uint64_t max_bytes, FILE** f, uint64_t* size) {
    *f = nullptr;
    *size = 0;
    // stat first, so that a device is not even opened (opening some has effects);
    // then open without blocking (a FIFO swapped in meanwhile) and check again.
    struct stat sb;
    std::string err;
    if (stat(path.c_str(), &sb) == 0 && !(err = check_regular(path, sb, max_bytes)).empty()) return err;
    int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return "cannot open '" + path + "': " + strerror(e) +
               (e == ENOENT ? " (does the file exist? paths are relative to the current directory)" : " (is it readable?)");
    }
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return "cannot stat '" + path + "': " + strerror(e) + " (is it readable?)";
    }
    if (!(err = check_regular(path, sb, max_bytes)).empty()) { close(fd); return err; }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);  // a regular file: plain reads from here on
    *f = fdopen(fd, "rb");
    if (!*f) { close(fd); return "cannot open '" + path + "': " + strerror(errno); }
    *size = (uint64_t)sb.st_size;
    return "";
}

std::string file_read_all(const std::string& path, uint64_t max_bytes, std::string* out) {
    out->clear();
    FILE* f = nullptr;
    uint64_t size = 0;
    std::string err = file_open_regular(path, max_bytes, &f, &size);
    if (!err.empty()) return err;
    out->resize((size_t)size);
    size_t got = size ? fread(&(*out)[0], 1, (size_t)size, f) : 0;
    char extra;
    bool grew = fread(&extra, 1, 1, f) == 1;
    fclose(f);
    if (got != size || grew) {
        out->clear();
        return "'" + path + "': read failed or the file changed while being read (is another process writing it?)";
    }
    return "";
}

std::string file_fingerprint(const std::string& path, uint64_t max_bytes) {
    FILE* f = nullptr;
    uint64_t size = 0;
    if (!file_open_regular(path, max_bytes, &f, &size).empty()) return "";
    uint64_t h = 0xcbf29ce484222325ULL, n = 0;  // st_checksum, a block at a time
    std::vector<unsigned char> buf(1 << 20);
    for (size_t got; (got = fread(buf.data(), 1, buf.size(), f)) > 0; n += got)
        for (size_t i = 0; i < got; i++) h = (h ^ buf[i]) * 0x100000001b3ULL;
    fclose(f);
    char out[64];
    snprintf(out, sizeof out, "%llu:%016llx", (unsigned long long)n, (unsigned long long)h);
    return out;
}
