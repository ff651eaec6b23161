#pragma once
// One exception type for every user-facing failure: the message names the file, tensor,
// field or request member that is wrong, and what was expected versus found.
#include <fmt/format.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace ms {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

template <class... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace ms
