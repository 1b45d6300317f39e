#include "services/packtool_protos.h"

namespace strata::services {

v1::ConvertProgress ProgressToProto(const packtool::ConvertProgress& progress) {
  v1::ConvertProgress proto;
  proto.set_phase(progress.phase);
  proto.set_bytes_done(progress.bytes_done);
  proto.set_bytes_total(progress.bytes_total);
  proto.set_experts_done(progress.experts_done);
  proto.set_experts_total(progress.experts_total);
  proto.set_bytes_per_second(progress.bytes_per_second);
  proto.set_rel_rms_error(progress.rel_rms_error);
  return proto;
}

packtool::ConvertProgress ProgressFromProto(const v1::ConvertProgress& proto) {
  packtool::ConvertProgress progress;
  progress.phase = proto.phase();
  progress.bytes_done = proto.bytes_done();
  progress.bytes_total = proto.bytes_total();
  progress.experts_done = proto.experts_done();
  progress.experts_total = proto.experts_total();
  progress.bytes_per_second = proto.bytes_per_second();
  progress.rel_rms_error = proto.rel_rms_error();
  return progress;
}

v1::ConvertProgress FinalProgress(const packtool::ConvertProgress* last, const pack::v1::Manifest& manifest) {
  v1::ConvertProgress proto;
  if (last != nullptr) proto = ProgressToProto(*last);
  proto.set_phase("done");
  if (proto.bytes_total() == 0) proto.set_bytes_total(manifest.experts_bytes());
  if (proto.experts_total() == 0) {
    proto.set_experts_total(uint64_t{manifest.geometry().n_moe_layers()} * manifest.geometry().n_expert());
  }
  proto.set_bytes_done(proto.bytes_total());
  proto.set_experts_done(proto.experts_total());
  *proto.mutable_manifest() = manifest;
  return proto;
}

v1::ValidateReport ValidationReportToProto(const packtool::ValidationReport& report) {
  v1::ValidateReport proto;
  proto.set_ok(report.ok());
  for (const packtool::ValidationProblem& problem : report.problems) {
    v1::Problem* out = proto.add_problems();
    out->set_file(problem.file);
    out->set_message(problem.message);
  }
  proto.set_blobs_checked(report.blobs_checked);
  proto.set_bytes_checked(report.bytes_checked);
  proto.set_seconds(report.seconds);
  proto.set_gb_per_second(report.gb_per_second);
  return proto;
}

v1::InspectReport InspectionToProto(const packtool::Inspection& inspection) {
  v1::InspectReport proto;
  proto.set_kind(inspection.kind);
  proto.set_architecture(inspection.architecture);
  *proto.mutable_geometry() = inspection.geometry;
  proto.set_scheme(inspection.scheme);
  proto.set_total_bytes(inspection.total_bytes);
  proto.set_tokenizer_model(inspection.tokenizer_model);
  proto.set_vocab_size(inspection.vocab_size);
  for (const packtool::TensorSummary& tensor : inspection.tensors) {
    v1::TensorSummary* out = proto.add_tensors();
    out->set_name(tensor.name);
    out->set_type(tensor.type);
    for (int64_t dim : tensor.shape) out->add_shape(dim);
    out->set_bytes(tensor.bytes);
  }
  proto.set_text(packtool::FormatInspection(inspection));
  return proto;
}

}  // namespace strata::services
