#include "packtool/version.h"

namespace strata::packtool {

std::string ToolVersion() { return std::string("strata-pack ") + STRATA_VERSION; }

}  // namespace strata::packtool
