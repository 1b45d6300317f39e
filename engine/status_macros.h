#ifndef STRATA_ENGINE_STATUS_MACROS_H_
#define STRATA_ENGINE_STATUS_MACROS_H_

// Abseil 20220623 ships Status and StatusOr but no propagation macros; these are the project's pair, and
// its one way to say where an error happened (WithContext).

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace strata {

// `status` with "context: " before its message and its code kept; OK stays OK.
inline absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace strata

#define STRATA_CONCAT_INNER_(a, b) a##b
#define STRATA_CONCAT_(a, b) STRATA_CONCAT_INNER_(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing function when it is not OK.
#define RETURN_IF_ERROR(expr)                                  \
  do {                                                         \
    ::absl::Status strata_status_ = (expr);                    \
    if (!strata_status_.ok()) return strata_status_;           \
  } while (false)

// Evaluates `rexpr` (an absl::StatusOr<T>); on error returns its status, else moves the value into `lhs`,
// which may be a declaration (`auto x`) or an existing lvalue.
#define ASSIGN_OR_RETURN(lhs, rexpr) \
  STRATA_ASSIGN_OR_RETURN_IMPL_(STRATA_CONCAT_(strata_statusor_, __LINE__), lhs, rexpr)

#define STRATA_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                                  \
  if (!statusor.ok()) return std::move(statusor).status();  \
  lhs = std::move(statusor).value()

#endif  // STRATA_ENGINE_STATUS_MACROS_H_
