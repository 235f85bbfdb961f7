// Fail-fast checks for broken invariants. Errors a caller can handle are absl::Status instead;
// these are for "this cannot happen unless Braid (or a plugin) has a bug", and they always
// name the file and line, in optimised builds too.
#ifndef BRAID_CORE_CHECK_H_
#define BRAID_CORE_CHECK_H_

#include <sstream>
#include <string>

namespace braid::internal {

[[noreturn]] void CheckFailed(const char* file, int line, const char* cond, const std::string& msg);

// Collects the streamed message of a failing check; only built when the check fails.
class CheckMessage {
 public:
  CheckMessage(const char* file, int line, const char* cond) : file_(file), line_(line), cond_(cond) {}
  [[noreturn]] ~CheckMessage() noexcept(false) { CheckFailed(file_, line_, cond_, os_.str()); }
  template <typename T>
  CheckMessage& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  const char* file_;
  int line_;
  const char* cond_;
  std::ostringstream os_;
};

}  // namespace braid::internal

#define BRAID_CHECK(cond) \
  if (__builtin_expect(!!(cond), 1)) {} else ::braid::internal::CheckMessage(__FILE__, __LINE__, #cond)

#define BRAID_CHECK_EQ(a, b) BRAID_CHECK((a) == (b)) << "(" << (a) << " vs " << (b) << ") "
#define BRAID_CHECK_OK(expr)                                               \
  do {                                                                     \
    auto _braid_st = (expr);                                               \
    BRAID_CHECK(_braid_st.ok()) << _braid_st.ToString();                  \
  } while (0)

// Propagates a non-OK absl::Status to the caller.
#define BRAID_RETURN_IF_ERROR(expr)          \
  do {                                       \
    auto _braid_st = (expr);                 \
    if (!_braid_st.ok()) return _braid_st;   \
  } while (0)

#define BRAID_CONCAT_INNER(a, b) a##b
#define BRAID_CONCAT(a, b) BRAID_CONCAT_INNER(a, b)
#define BRAID_ASSIGN_OR_RETURN(lhs, expr) \
  BRAID_ASSIGN_OR_RETURN_IMPL(BRAID_CONCAT(_braid_sor_, __LINE__), lhs, expr)
#define BRAID_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()

#endif  // BRAID_CORE_CHECK_H_
