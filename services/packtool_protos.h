#ifndef STRATA_SERVICES_PACKTOOL_PROTOS_H_
#define STRATA_SERVICES_PACKTOOL_PROTOS_H_

// Copies packtool results into the strata.v1 messages. The service answers with them and the in-process CLI
// prints from them too, so both modes of strata-pack print the same thing. Pure functions.

#include "packtool/convert.h"
#include "packtool/inspect.h"
#include "packtool/validate.h"
#include "strata/v1/packtool.pb.h"

namespace strata::services {

v1::ConvertProgress ProgressToProto(const packtool::ConvertProgress& progress);
packtool::ConvertProgress ProgressFromProto(const v1::ConvertProgress& progress);

// The last message of a conversion: the last progress seen (if any) completed, phase "done", the manifest.
v1::ConvertProgress FinalProgress(const packtool::ConvertProgress* last, const pack::v1::Manifest& manifest);

v1::ValidateReport ValidationReportToProto(const packtool::ValidationReport& report);

// `text` is FormatInspection's.
v1::InspectReport InspectionToProto(const packtool::Inspection& inspection);

}  // namespace strata::services

#endif  // STRATA_SERVICES_PACKTOOL_PROTOS_H_
