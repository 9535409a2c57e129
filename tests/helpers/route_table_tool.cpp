// Test helper: prints the server's route table as JSON lines ({"path", "methods", "needs_api_key"}),
// so the API-key test walks every route the server has, including ones added later.
#include <iostream>
#include <nlohmann/json.hpp>

#include "server/server.h"

int main() {
  for (const auto& r : nibble::server::route_table())
    std::cout << nlohmann::json{{"path", r.path}, {"methods", r.methods}, {"needs_api_key", r.needs_api_key}}.dump() << "\n";
  return 0;
}
