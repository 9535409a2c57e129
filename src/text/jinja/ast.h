// Jinja template syntax tree: expressions and statements, as parsed from a template's source.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja/value.h"

namespace nibble::text::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    LITERAL,
    NAME,
    ATTR,
    ITEM,
    SLICE,
    CALL,
    FILTER,
    TEST,
    UNARY,
    BINARY,
    CONDITIONAL,
    LIST,
    DICT,
    TUPLE,
  };
  Kind kind;
  int line = 0;
  Value literal;                  // LITERAL
  std::string name;               // NAME, ATTR (attribute), FILTER/TEST (name), UNARY/BINARY (operator)
  std::vector<ExprPtr> children;  // operands, args, list items, dict keys/values interleaved
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // CALL/FILTER/TEST keyword arguments
  bool negated = false;                                 // TEST: "is not"
};

struct Node;
using NodeList = std::vector<std::unique_ptr<Node>>;

struct Node {
  enum class Kind { TEXT, OUTPUT, IF, FOR, SET, SET_BLOCK, MACRO, CALL_BLOCK, FILTER_BLOCK, BREAK, CONTINUE };
  Kind kind;
  int line = 0;
  std::string text;                  // TEXT; SET_BLOCK/MACRO name
  ExprPtr expr;                      // OUTPUT, FOR iterable, SET value, CALL_BLOCK call, FILTER_BLOCK/SET_BLOCK filters
  std::vector<std::string> targets;  // FOR loop variables, SET names ("ns.attr" for attribute sets)
  std::vector<std::pair<ExprPtr, NodeList>> branches;   // IF: (condition, body)...; FOR: ({filter}, body)
  NodeList body;                                        // FOR/SET_BLOCK/MACRO/CALL_BLOCK/FILTER_BLOCK body
  NodeList else_body;                                   // IF/FOR else
  std::vector<std::pair<std::string, ExprPtr>> params;  // MACRO/CALL_BLOCK parameters with defaults
};

}  // namespace nibble::text::jinja
