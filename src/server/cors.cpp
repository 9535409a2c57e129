// Cors: Starlette's CORSMiddleware (starlette/middleware/cors.py) rule by rule.
#include "server/cors.h"

#include <algorithm>
#include <cctype>

namespace nibble::server {
namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

bool contains(const std::vector<std::string>& items, const std::string& x) {
  return std::find(items.begin(), items.end(), x) != items.end();
}

}  // namespace

Cors::Cors(CorsPolicy policy) : policy_(std::move(policy)) {
  all_origins_ = contains(policy_.origins, "*");
  all_headers_ = contains(policy_.headers, "*");
  methods_ = contains(policy_.methods, "*")
                 ? std::vector<std::string>{"DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT"}
                 : policy_.methods;
  explicit_origin_ = !all_origins_ || policy_.allow_credentials;
  for (const std::string& h : policy_.headers) allowed_headers_.push_back(lower(h));
  if (!all_headers_)  // the CORS-safelisted request headers are always allowed
    for (const char* h : {"accept", "accept-language", "content-language", "content-type"})
      if (!contains(allowed_headers_, h)) allowed_headers_.push_back(h);
  std::sort(allowed_headers_.begin(), allowed_headers_.end());
}

bool Cors::origin_allowed(const std::string& origin) const { return all_origins_ || contains(policy_.origins, origin); }

std::string Cors::origin_headers(const std::string& origin) const {
  std::string headers = explicit_origin_ ? "Access-Control-Allow-Origin: " + origin + "\r\nVary: Origin\r\n"
                                         : "Access-Control-Allow-Origin: *\r\n";
  if (policy_.allow_credentials) headers += "Access-Control-Allow-Credentials: true\r\n";
  return headers;
}

std::pair<int, std::string> Cors::preflight(const std::string& origin, const std::string& method,
                                            const std::string& requested_headers, std::string& headers) const {
  std::vector<std::string> refused;
  if (!origin_allowed(origin)) refused.push_back("origin");
  if (!contains(methods_, method)) refused.push_back("method");
  headers = origin_headers(origin);
  headers += "Access-Control-Allow-Methods: " + join(methods_) + "\r\nAccess-Control-Max-Age: 600\r\n";
  if (all_headers_) {  // any header: the requested ones are echoed
    if (!requested_headers.empty()) headers += "Access-Control-Allow-Headers: " + requested_headers + "\r\n";
  } else {
    headers += "Access-Control-Allow-Headers: " + join(allowed_headers_) + "\r\n";
    for (size_t at = 0; at < requested_headers.size();) {
      size_t comma = requested_headers.find(',', at);
      if (comma == std::string::npos) comma = requested_headers.size();
      std::string h = lower(requested_headers.substr(at, comma - at));
      h.erase(0, h.find_first_not_of(" \t"));
      h.erase(h.find_last_not_of(" \t") + 1);
      if (!h.empty() && !contains(allowed_headers_, h)) {
        refused.push_back("headers");
        break;
      }
      at = comma + 1;
    }
  }
  if (refused.empty()) return {200, "OK"};
  return {400, "Disallowed CORS " + join(refused)};
}

std::string Cors::simple_headers(const std::string& origin) const {
  return origin_allowed(origin) ? origin_headers(origin) : "";
}

}  // namespace nibble::server
