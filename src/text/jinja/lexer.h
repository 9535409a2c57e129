// Jinja lexing: the template cut into text / {{ expression }} / {% statement %} pieces with
// whitespace control applied (jinja2.lexer semantics with trim_blocks and lstrip_blocks on, comments
// dropped), and a tag's inside cut into tokens. The parser (parser.cpp) reads both.
#pragma once

#include <string>
#include <vector>

#include "text/jinja/ast.h"

namespace nibble::text::jinja {

struct Piece {
  enum Kind { TEXT, EXPRESSION, STATEMENT } kind;
  std::string content;
  int line;
};

// The template's pieces in order, each with the line it starts on. Errors name the line.
Result<std::vector<Piece>> split_pieces(const std::string& src);

struct Token {
  enum Kind { NAME, INT, FLOAT, STRING, OP, END } kind;
  std::string text;
  Value value;
};

// A tag's tokens, ending with an END token; `line` names errors (unterminated strings, unknown
// characters, numbers out of range).
Result<std::vector<Token>> tokenize(const std::string& s, int line);

}  // namespace nibble::text::jinja
