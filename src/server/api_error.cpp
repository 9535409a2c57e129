// ApiError bodies and RequestFields.
#include "server/api_error.h"

namespace nibble::server {

std::string error_body(const ApiError& e) {
  const char* type = e.status == 404   ? "NotFoundError"
                     : e.status == 405 ? "MethodNotAllowedError"
                     : e.status == 503 ? "ServiceUnavailableError"
                     : e.status >= 500 ? "InternalServerError"
                                       : "BadRequestError";
  return dump({{"error",
                {{"message", e.message},
                 {"type", type},
                 {"param", e.param.empty() ? json(nullptr) : json(e.param)},
                 {"code", e.status}}}});
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

bool RequestFields::fail(const char* key, const std::string& why) {
  if (!error) error = ApiError{400, std::string("'") + key + "' " + why, key};
  return false;
}

bool RequestFields::integer(const char* key, int64_t& out, int64_t lo, int64_t hi) {
  if (!has(key)) return true;
  const json& v = body_[key];
  if (!v.is_number_integer() && !(v.is_number_float() && v.get<double>() == static_cast<int64_t>(v.get<double>())))
    return fail(key, "must be an integer");
  const int64_t x = v.is_number_integer() ? v.get<int64_t>() : static_cast<int64_t>(v.get<double>());
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi)) return fail(key, "is too large");
  if (x < lo || x > hi) return fail(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  out = x;
  return true;
}

bool RequestFields::number(const char* key, double& out, double lo, double hi) {
  if (!has(key)) return true;
  const json& v = body_[key];
  if (!v.is_number()) return fail(key, "must be a number");
  const double x = v.get<double>();
  if (!(x >= lo && x <= hi)) {
    json range = {lo, hi};
    return fail(key, "must be in [" + range[0].dump() + ", " + range[1].dump() + "]");
  }
  out = x;
  return true;
}

bool RequestFields::number(const char* key, float& out, double lo, double hi) {
  double x = out;
  if (!number(key, x, lo, hi)) return false;
  out = static_cast<float>(x);
  return true;
}

bool RequestFields::boolean(const char* key, bool& out) {
  if (!has(key)) return true;
  if (!body_[key].is_boolean()) return fail(key, "must be true or false");
  out = body_[key].get<bool>();
  return true;
}

bool RequestFields::string(const char* key, std::string& out) {
  if (!has(key)) return true;
  if (!body_[key].is_string()) return fail(key, "must be a string");
  out = body_[key].get<std::string>();
  return true;
}

bool RequestFields::strings(const char* key, std::vector<std::string>& out) {
  if (!has(key)) return true;
  const json& v = body_[key];
  if (v.is_string()) {
    out = {v.get<std::string>()};
    return true;
  }
  if (!v.is_array()) return fail(key, "must be a string or a list of strings");
  out.clear();
  for (const json& s : v) {
    if (!s.is_string()) return fail(key, "must be a string or a list of strings");
    out.push_back(s.get<std::string>());
  }
  return true;
}

bool RequestFields::integers(const char* key, std::vector<int32_t>& out, int64_t lo, int64_t hi) {
  if (!has(key)) return true;
  const json& v = body_[key];
  if (!v.is_array()) return fail(key, "must be a list of integers");
  out.clear();
  for (const json& x : v) {
    if (!x.is_number_integer()) return fail(key, "must be a list of integers");
    if (x.is_number_unsigned() ? x.get<uint64_t>() > static_cast<uint64_t>(hi)
                               : (x.get<int64_t>() < lo || x.get<int64_t>() > hi))
      return fail(key, "has a value outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    out.push_back(static_cast<int32_t>(x.get<int64_t>()));
  }
  return true;
}

}  // namespace nibble::server
