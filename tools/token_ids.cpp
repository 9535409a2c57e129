// Token-id list parsing for the CLI.
#include "tools/token_ids.h"

#include <climits>
#include <sstream>

namespace nibble::tools {

Result<std::vector<int32_t>> parse_token_ids(const std::string& text, const std::string& option) {
  std::vector<int32_t> ids;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(item);
      ids.push_back(static_cast<int32_t>(v));
    } catch (const std::exception&) {
      return Status::error(option + ": '" + item + "' is not a token id");
    }
  }
  if (ids.empty()) return Status::error(option + ": no token ids given");
  return ids;
}

}  // namespace nibble::tools
