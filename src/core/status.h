// Status and Result<T>: how user-facing errors (bad files, bad requests, bad values) travel.
// Programmer errors use NIB_CHECK (check.h) instead; nothing here ever aborts.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace nibble {

// An error message, or success. The message names what was wrong and where.
class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status error(std::string message) { return Status(std::move(message)); }

  bool is_ok() const { return !message_.has_value(); }
  explicit operator bool() const { return is_ok(); }
  const std::string& message() const {
    static const std::string empty;
    return message_ ? *message_ : empty;
  }

 private:
  explicit Status(std::string message) : message_(std::move(message)) {}
  std::optional<std::string> message_;
};

// A value or an error Status (C++20 has no std::expected).
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}         // NOLINT: implicit on purpose
  Result(Status status) : state_(std::move(status)) {}  // NOLINT: must be an error status

  bool is_ok() const { return std::holds_alternative<T>(state_); }
  explicit operator bool() const { return is_ok(); }
  const Status& status() const {
    static const Status ok_status;
    return is_ok() ? ok_status : std::get<Status>(state_);
  }
  T& value() & { return std::get<T>(state_); }
  const T& value() const& { return std::get<T>(state_); }
  T&& value() && { return std::get<T>(std::move(state_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() { return value(); }

 private:
  std::variant<T, Status> state_;
};

}  // namespace nibble

// Return the error of a Status-returning expression from the enclosing function.
#define NIB_RETURN_IF_ERROR(expr)                 \
  do {                                            \
    ::nibble::Status nib_status_ = (expr);        \
    if (!nib_status_.is_ok()) return nib_status_; \
  } while (0)
