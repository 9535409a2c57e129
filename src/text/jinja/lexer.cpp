// The Jinja lexer of lexer.h.
#include "text/jinja/lexer.h"

#include <cctype>

namespace nibble::text::jinja {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

}  // namespace

Result<std::vector<Piece>> split_pieces(const std::string& src) {
  std::vector<Piece> pieces;
  size_t pos = 0;
  int line = 1;
  bool strip_next = false, trim_next_newline = false;
  while (pos <= src.size()) {
    size_t open = src.find('{', pos);
    while (open != std::string::npos && open + 1 < src.size() && src[open + 1] != '{' && src[open + 1] != '%' &&
           src[open + 1] != '#')
      open = src.find('{', open + 1);
    if (open != std::string::npos && open + 1 >= src.size()) open = std::string::npos;
    std::string text = src.substr(pos, (open == std::string::npos ? src.size() : open) - pos);
    if (strip_next) {
      size_t k = 0;
      while (k < text.size() && is_space(text[k])) ++k;
      text.erase(0, k);
    } else if (trim_next_newline && !text.empty() && text[0] == '\n') {
      text.erase(0, 1);
    } else if (trim_next_newline && text.size() > 1 && text[0] == '\r' && text[1] == '\n') {
      text.erase(0, 2);
    }
    strip_next = trim_next_newline = false;
    if (open == std::string::npos) {
      if (!text.empty()) pieces.push_back({Piece::TEXT, text, line});
      break;
    }
    const char type = src[open + 1];
    size_t inner = open + 2;
    const bool strip_before = inner < src.size() && src[inner] == '-';
    const bool keep_before = inner < src.size() && src[inner] == '+';
    if (strip_before || keep_before) ++inner;
    if (strip_before) {
      while (!text.empty() && is_space(text.back())) text.pop_back();
    } else if (!keep_before && type != '{') {
      // lstrip_blocks: spaces and tabs between the line start and a block or comment tag go.
      size_t k = text.size();
      while (k > 0 && (text[k - 1] == ' ' || text[k - 1] == '\t')) --k;
      const size_t run_start = open - (text.size() - k);  // where the spaces before the tag begin in src
      const bool at_line_start = run_start == 0 || src[run_start - 1] == '\n';
      if (at_line_start) text.erase(k);
    }
    for (char c : text) line += c == '\n';
    if (!text.empty()) pieces.push_back({Piece::TEXT, text, line});
    const std::string closing = type == '{' ? "}}" : type == '%' ? "%}" : "#}";
    size_t close = src.find(closing, inner);
    // A string inside an expression may contain the closing delimiter: skip quoted runs.
    if (type != '#') {
      size_t k = inner;
      char quote = 0;
      for (; k + 1 < src.size(); ++k) {
        if (quote) {
          if (src[k] == '\\')
            ++k;
          else if (src[k] == quote)
            quote = 0;
        } else if (src[k] == '"' || src[k] == '\'') {
          quote = src[k];
        } else if (src.compare(k, 2, closing) == 0) {
          break;
        }
      }
      close = k + 1 < src.size() ? k : std::string::npos;
    }
    if (close == std::string::npos)
      return Status::error("line " + std::to_string(line) + ": unclosed '{" + type + "' tag");
    size_t content_end = close;
    if (content_end > inner && (src[content_end - 1] == '-' || src[content_end - 1] == '+')) {
      strip_next = src[content_end - 1] == '-';
      const bool keep_after = src[content_end - 1] == '+';
      --content_end;
      trim_next_newline = type != '{' && !keep_after && !strip_next;
    } else {
      trim_next_newline = type != '{';  // trim_blocks: the newline after a block or comment tag goes
    }
    const std::string content = src.substr(inner, content_end - inner);
    if (type == '{')
      pieces.push_back({Piece::EXPRESSION, content, line});
    else if (type == '%')
      pieces.push_back({Piece::STATEMENT, content, line});
    for (char c : src.substr(open, close + 2 - open)) line += c == '\n';
    pos = close + 2;
  }
  return pieces;
}

Result<std::vector<Token>> tokenize(const std::string& s, int line) {
  std::vector<Token> out;
  size_t i = 0;
  auto err = [&](const std::string& what) { return Status::error("line " + std::to_string(line) + ": " + what); };
  while (i < s.size()) {
    const char c = s[i];
    if (is_space(c)) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (std::isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Token::NAME, s.substr(i, j - i), {}});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool is_float = false;
      while (j < s.size() && (std::isdigit(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      if (j + 1 < s.size() && s[j] == '.' && std::isdigit(static_cast<unsigned char>(s[j + 1]))) {
        is_float = true;
        ++j;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      }
      if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
        is_float = true;
        ++j;
        if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
        while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      }
      std::string num;
      for (size_t k = i; k < j; ++k)
        if (s[k] != '_') num += s[k];
      try {
        out.push_back({is_float ? Token::FLOAT : Token::INT, num,
                       is_float ? Value(std::stod(num)) : Value(static_cast<int64_t>(std::stoll(num)))});
      } catch (const std::exception&) {  // out of range for int64 / double
        return err("number " + num + " is out of range");
      }
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string v;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] == '\\' && j + 1 < s.size()) {
          const char e = s[++j];
          switch (e) {
            case 'n':
              v += '\n';
              break;
            case 't':
              v += '\t';
              break;
            case 'r':
              v += '\r';
              break;
            case '\\':
              v += '\\';
              break;
            case '\'':
              v += '\'';
              break;
            case '"':
              v += '"';
              break;
            default:
              v += '\\', v += e;
          }
        } else {
          v += s[j];
        }
      }
      if (j >= s.size()) return err("unterminated string");
      out.push_back({Token::STRING, v, Value(v)});
      i = j + 1;
    } else {
      static const char* OPS[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "<", ">",
                                  "=",  "(",  ")",  "[",  "]",  "{",  "}", ",", ".", ":", "|", "~"};
      bool found = false;
      for (const char* op : OPS) {
        if (s.compare(i, std::char_traits<char>::length(op), op) == 0) {
          out.push_back({Token::OP, op, {}});
          i += std::char_traits<char>::length(op);
          found = true;
          break;
        }
      }
      if (!found) return err(std::string("unexpected character '") + c + "'");
    }
  }
  out.push_back({Token::END, "", {}});
  return out;
}

}  // namespace nibble::text::jinja
