#include "services/data_root.h"

#include <filesystem>
#include <fstream>

#include "gtest/gtest.h"
#include "tests/testing/test_util.h"

namespace strata::services {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::ScratchDir;

class DataRootTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_path_ = scratch_.Join("root");
    outside_ = scratch_.Join("outside");
    fs::create_directories(root_path_ + "/models");
    fs::create_directories(outside_);
    std::ofstream(root_path_ + "/models/a.gguf") << "x";
    std::ofstream(outside_ + "/secret.gguf") << "x";
    auto root = DataRoot::Create(root_path_);
    ASSERT_TRUE(root.ok()) << root.status();
    root_ = *std::move(root);
  }

  ScratchDir scratch_;
  std::string root_path_;
  std::string outside_;
  std::unique_ptr<DataRoot> root_;
};

TEST_F(DataRootTest, CreateRefusesMissingRootAndFiles) {
  EXPECT_EQ(DataRoot::Create(scratch_.Join("nope")).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(DataRoot::Create(root_path_ + "/models/a.gguf").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DataRoot::Create("").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(DataRootTest, RelativeWritesPathsInsideTheRootAsClientsNameThem) {
  const std::string root = root_->path();
  const absl::Status s = root_->Relative(absl::DataLossError(
      root + "/models/a.gguf: truncated; see " + root + "/models/b.gguf and " + root + " itself"));
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "models/a.gguf: truncated; see models/b.gguf and . itself");
  EXPECT_TRUE(root_->Relative(absl::OkStatus()).ok());
  // Paths outside the root are left alone, also those that only begin with its name.
  EXPECT_EQ(root_->Relative(absl::NotFoundError(outside_)).message(), outside_);
  EXPECT_EQ(root_->Relative(absl::NotFoundError(root + "2/x")).message(), root + "2/x");
  EXPECT_EQ(root_->Relative(absl::NotFoundError("/backup" + root + "/x")).message(), "/backup" + root + "/x");
}

TEST_F(DataRootTest, RelativePathsAreTakenFromTheRoot) {
  auto resolved = root_->Resolve("models/a.gguf", "input");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, fs::canonical(root_path_).string() + "/models/a.gguf");
  EXPECT_EQ(*root_->Resolve("./models/../models/a.gguf", "input"), *resolved);
  EXPECT_EQ(*root_->Resolve(".", "input"), root_->path());
}

TEST_F(DataRootTest, PathsThatDoNotExistYetResolveWhereTheyWouldLand) {
  auto resolved = root_->Resolve("packs/new-pack", "output_dir");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, root_->path() + "/packs/new-pack");
}

TEST_F(DataRootTest, AbsolutePathInsideIsAccepted) {
  auto resolved = root_->Resolve(root_path_ + "/models/a.gguf", "input");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, root_->path() + "/models/a.gguf");
}

TEST_F(DataRootTest, EmptyPathNamesTheField) {
  EXPECT_THAT(root_->Resolve("", "output_dir").status(),
              StatusIsWith(absl::StatusCode::kInvalidArgument, "output_dir"));
}

TEST_F(DataRootTest, DotDotOutOfTheRootIsDenied) {
  EXPECT_THAT(root_->Resolve("../outside/secret.gguf", "input").status(),
              StatusIsWith(absl::StatusCode::kPermissionDenied, "input"));
  EXPECT_THAT(root_->Resolve("../x", "input").status(), StatusIs(absl::StatusCode::kPermissionDenied));
  // Through a directory that does not exist.
  EXPECT_THAT(root_->Resolve("missing/../../x", "input").status(), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(root_->Resolve("..", "input").status(), StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST_F(DataRootTest, AbsolutePathOutsideIsDenied) {
  EXPECT_THAT(root_->Resolve(outside_ + "/secret.gguf", "input").status(),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(root_->Resolve("/etc/passwd", "path").status(),
              StatusIsWith(absl::StatusCode::kPermissionDenied, "path"));
}

TEST_F(DataRootTest, SiblingWithTheRootAsPrefixIsDenied) {
  fs::create_directories(root_path_ + "2");
  EXPECT_THAT(root_->Resolve(root_path_ + "2/x", "input").status(), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(root_->Resolve("../root2/x", "input").status(), StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST_F(DataRootTest, SymlinkInsidePointingOutsideIsDenied) {
  fs::create_symlink(outside_ + "/secret.gguf", root_path_ + "/models/link.gguf");
  fs::create_directory_symlink(outside_, root_path_ + "/outdir");
  EXPECT_THAT(root_->Resolve("models/link.gguf", "input").status(), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(root_->Resolve("outdir/secret.gguf", "input").status(), StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST_F(DataRootTest, OutputWhoseParentIsASymlinkOutsideIsDenied) {
  fs::create_directory_symlink(outside_, root_path_ + "/packs");
  EXPECT_THAT(root_->Resolve("packs/new-pack", "output_dir").status(),
              StatusIsWith(absl::StatusCode::kPermissionDenied, "output_dir"));
}

TEST_F(DataRootTest, DanglingSymlinkPointingOutsideIsDenied) {
  fs::create_symlink(outside_ + "/not-yet", root_path_ + "/pending");
  EXPECT_THAT(root_->Resolve("pending", "output_dir").status(), StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(root_->Resolve("pending/sub", "output_dir").status(), StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST_F(DataRootTest, SymlinkStayingInsideIsFollowed) {
  fs::create_symlink("models/a.gguf", root_path_ + "/current.gguf");
  auto resolved = root_->Resolve("current.gguf", "input");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, root_->path() + "/models/a.gguf");
}

TEST_F(DataRootTest, RootGivenThroughASymlinkIsCanonical) {
  fs::create_directory_symlink(root_path_, scratch_.Join("root-link"));
  auto root = DataRoot::Create(scratch_.Join("root-link"));
  ASSERT_TRUE(root.ok()) << root.status();
  EXPECT_EQ((*root)->path(), root_->path());
  auto resolved = (*root)->Resolve(scratch_.Join("root-link") + "/models/a.gguf", "input");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, root_->path() + "/models/a.gguf");
}

TEST_F(DataRootTest, SymlinkLoopIsRefused) {
  fs::create_symlink("loop-b", root_path_ + "/loop-a");
  fs::create_symlink("loop-a", root_path_ + "/loop-b");
  EXPECT_THAT(root_->Resolve("loop-a", "input").status(), StatusIsWith(absl::StatusCode::kInvalidArgument, "input"));
}

}  // namespace
}  // namespace strata::services
