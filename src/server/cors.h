// Cross-origin resource sharing as Starlette's CORSMiddleware answers it in vLLM's server (vLLM's
// --allowed-origins, --allowed-methods, --allowed-headers, --allow-credentials): the HTTP layer
// answers preflights before any route or API key check and adds the headers to other responses.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace nibble::server {

struct CorsPolicy {
  bool enabled = false;
  std::vector<std::string> origins = {"*"}, methods = {"*"}, headers = {"*"};
  bool allow_credentials = false;
};

class Cors {
 public:
  explicit Cors(CorsPolicy policy);
  // A preflight (OPTIONS with Origin and Access-Control-Request-Method): its status and body text
  // (200 "OK", or 400 naming what was refused), and its header lines in `headers`.
  std::pair<int, std::string> preflight(const std::string& origin, const std::string& method,
                                        const std::string& requested_headers, std::string& headers) const;
  // The header lines an ordinary request from `origin` gets ("" when its origin is refused).
  std::string simple_headers(const std::string& origin) const;

 private:
  bool origin_allowed(const std::string& origin) const;
  std::string origin_headers(const std::string& origin) const;  // Allow-Origin (+ Vary), Allow-Credentials

  CorsPolicy policy_;
  bool all_origins_ = false, all_headers_ = false, explicit_origin_ = false;
  std::vector<std::string> methods_, allowed_headers_;  // "*" expanded; headers lowercased, safelisted added
};

}  // namespace nibble::server
