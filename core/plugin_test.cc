// Loads the plugins of core/testing/plugins into a test linked like the real program (core
// statically, -rdynamic), so a plugin that only works with a shared core would fail here too.
#include "core/plugin.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/plugin_api.h"
#include "core/registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "third_party/runfiles.h"

namespace braid {
namespace {

using ::bazel::tools::cpp::runfiles::Runfiles;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string PluginDir() {
  std::string error;
  static Runfiles* runfiles = Runfiles::CreateForTest(&error);
  EXPECT_NE(runfiles, nullptr) << error;
  std::string so = runfiles->Rlocation("braid/core/testing/plugins/libbraid_test_good.so");
  return so.substr(0, so.rfind('/'));
}

std::string PluginPath(const std::string& name) {
  return absl::StrCat(PluginDir(), "/libbraid_", name, ".so");
}

std::string TempDir() {
  const char* d = ::getenv("TEST_TMPDIR");
  return d != nullptr ? d : "/tmp";
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST(PluginTest, GoodPluginLoadsByNameAndItsStrategyIsMakeable) {
  ASSERT_TRUE(LoadPlugin("test_good", {"/nonexistent/braid", PluginDir()}).ok());
  EXPECT_TRUE(Registry::Get().HasStrategy("test_good"));
  absl::StatusOr<std::unique_ptr<Strategy>> s = Registry::Get().MakeStrategy("test_good");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->name(), "test_good");
}

TEST(PluginTest, LoadingTheSameFileTwiceIsANoOp) {
  ASSERT_TRUE(LoadPlugin("test_good", {PluginDir()}).ok());
  // Again by name, by path, and through a symlink: each would fail as a duplicate if the
  // plugin's register ran a second time.
  absl::Status by_name = LoadPlugin("test_good", {PluginDir()});
  EXPECT_TRUE(by_name.ok()) << by_name;
  absl::Status by_path = LoadPlugin(PluginPath("test_good"), {});
  EXPECT_TRUE(by_path.ok()) << by_path;
  std::string link = TempDir() + "/libbraid_linked_good.so";
  ::unlink(link.c_str());
  ASSERT_EQ(::symlink(PluginPath("test_good").c_str(), link.c_str()), 0);
  absl::Status by_link = LoadPlugin(link, {});
  EXPECT_TRUE(by_link.ok()) << by_link;
  std::vector<std::string> names = Registry::Get().StrategyNames();
  EXPECT_EQ(std::count(names.begin(), names.end(), "test_good"), 1);
}

TEST(PluginTest, MissingPluginListsEveryPathSearchedAndTheEnvironmentVariable) {
  absl::Status s = LoadPlugin("test_absent", {"/no/such/dir", "/other/dir/"});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(
      Message(s),
      AllOf(HasSubstr("'test_absent'"), HasSubstr("/no/such/dir/libbraid_test_absent.so"),
            HasSubstr("/no/such/dir/test_absent/libbraid_test_absent.so"),
            HasSubstr("/other/dir/libbraid_test_absent.so"), HasSubstr("$BRAID_PLUGIN_PATH")));
  absl::Status empty = LoadPlugin("test_absent", {});
  EXPECT_THAT(Message(empty), HasSubstr("search path is empty"));
}

TEST(PluginTest, NameIsAlsoFoundInAFolderOfPluginFolders) {
  // <root>/<name>/libbraid_<name>.so, the layout of plugins/ in the source tree and runfiles.
  std::string root = TempDir() + "/plugin_root";
  ::mkdir(root.c_str(), 0755);
  ::mkdir((root + "/test_good").c_str(), 0755);
  std::string link = root + "/test_good/libbraid_test_good.so";
  ::unlink(link.c_str());
  ASSERT_EQ(::symlink(PluginPath("test_good").c_str(), link.c_str()), 0);
  absl::Status found = LoadPlugin("test_good", {"/nonexistent", root});
  EXPECT_TRUE(found.ok()) << found;
  EXPECT_TRUE(Registry::Get().HasStrategy("test_good"));
}

TEST(PluginTest, MissingFileByPathNamesTheFile) {
  absl::Status s = LoadPlugin("/no/such/dir/libbraid_x.so", {});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(s), HasSubstr("/no/such/dir/libbraid_x.so"));
}

TEST(PluginTest, NeitherNameNorPathIsRejected) {
  absl::Status s = LoadPlugin("two words", {PluginDir()});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(s), HasSubstr("'two words'"));
}

TEST(PluginTest, SharedLibraryWithoutEntryPointsNamesTheMissingSymbol) {
  absl::Status s = LoadPlugin("test_no_entry", {PluginDir()});
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(Message(s), AllOf(HasSubstr("libbraid_test_no_entry.so"),
                                HasSubstr(BRAID_PLUGIN_ABI_VERSION_SYMBOL)));
  absl::Status half = LoadPlugin("test_half_entry", {PluginDir()});
  EXPECT_FALSE(half.ok());
  EXPECT_THAT(Message(half), AllOf(HasSubstr("libbraid_test_half_entry.so"),
                                   HasSubstr(BRAID_PLUGIN_REGISTER_SYMBOL)));
}

TEST(PluginTest, AbiMismatchNamesBothVersions) {
  absl::Status s = LoadPlugin(PluginPath("test_bad_abi"), {});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(Message(s), AllOf(HasSubstr("libbraid_test_bad_abi.so"),
                                HasSubstr(absl::StrCat("version ", BRAID_PLUGIN_ABI_VERSION + 41)),
                                HasSubstr(absl::StrCat("version ", BRAID_PLUGIN_ABI_VERSION)),
                                HasSubstr("rebuild the plugin against this Braid")));
}

TEST(PluginTest, RegisterReturningNonZeroIsAnError) {
  absl::Status s = LoadPlugin("test_fail_register", {PluginDir()});
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(Message(s),
              AllOf(HasSubstr("libbraid_test_fail_register.so"), HasSubstr("returned 3")));
  // The outcome is remembered: register does not run again, the error stays.
  EXPECT_EQ(LoadPlugin("test_fail_register", {PluginDir()}), s);
}

TEST(PluginTest, DuplicateStrategyNameNamesBothPlugins) {
  ASSERT_TRUE(LoadPlugin("test_good", {PluginDir()}).ok());
  // The duplicate plugin ignores AddStrategy's error and returns 0: the loader still fails.
  absl::Status s = LoadPlugin("test_duplicate", {PluginDir()});
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(Message(s), AllOf(HasSubstr("'test_good'"), HasSubstr("libbraid_test_good.so"),
                                HasSubstr("libbraid_test_duplicate.so")));
  // The first registration is kept.
  absl::StatusOr<std::unique_ptr<Strategy>> st = Registry::Get().MakeStrategy("test_good");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ((*st)->name(), "test_good");
}

TEST(PluginTest, DlopenFailureCarriesDlerrorText) {
  std::string junk = TempDir() + "/libbraid_junk.so";
  std::ofstream(junk) << "this is not an ELF file\n";
  absl::Status s = LoadPlugin(junk, {});
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(Message(s), AllOf(HasSubstr("libbraid_junk.so"), HasSubstr("dlopen failed")));

  absl::Status u = LoadPlugin("test_unresolved", {PluginDir()});
  EXPECT_FALSE(u.ok());
  EXPECT_THAT(Message(u),
              AllOf(HasSubstr("libbraid_test_unresolved.so"),
                    HasSubstr("braid_test_symbol_nobody_defines"), HasSubstr("-rdynamic")));
}

TEST(PluginTest, UnknownStrategyListsTheKnownOnes) {
  ASSERT_TRUE(LoadPlugin("test_good", {PluginDir()}).ok());
  absl::StatusOr<std::unique_ptr<Strategy>> s = Registry::Get().MakeStrategy("no_such_strategy");
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(s.status()), AllOf(HasSubstr("'no_such_strategy'"), HasSubstr("test_good")));
}

TEST(PluginTest, SearchPathComesFromTheEnvironmentThenExtras) {
  ::setenv("BRAID_PLUGIN_PATH", "/env/a::/env/b", 1);
  EXPECT_EQ(PluginSearchPath({"/extra"}), (std::vector<std::string>{"/env/a", "/env/b", "/extra"}));
  ::setenv("BRAID_PLUGIN_PATH", PluginDir().c_str(), 1);
  absl::Status s = EnsureStrategy("test_good", PluginSearchPath());
  EXPECT_TRUE(s.ok()) << s;
  ::unsetenv("BRAID_PLUGIN_PATH");
  EXPECT_TRUE(PluginSearchPath().empty());
}

TEST(PluginTest, EnsureStrategyLoadsThePluginOfThatName) {
  absl::Status s = EnsureStrategy("test_misnamed", {PluginDir()});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(s),
              AllOf(HasSubstr("libbraid_test_misnamed.so"),
                    HasSubstr("no strategy 'test_misnamed'"), HasSubstr("test_misnamed_strategy")));
  absl::Status absent = EnsureStrategy("test_absent", {PluginDir()});
  EXPECT_THAT(Message(absent), HasSubstr("libbraid_test_absent.so"));
}

TEST(PluginTest, UnknownModelListsTheKnownOnesAndTheSearchPath) {
  ModelSpec spec;
  spec.build = [](const config::ModelConfig&, uint64_t,
                  Device) -> absl::StatusOr<std::unique_ptr<Module>> {
    return absl::UnimplementedError("never built");
  };
  ASSERT_TRUE(Registry::Get().AddModel("plugin_test_model", spec, "plugin_test").ok());
  absl::Status known = EnsureModel("plugin_test_model", {});
  EXPECT_TRUE(known.ok()) << known;
  // As validation matches model.name: in any case.
  absl::Status upper = EnsureModel("Plugin_Test_Model", {});
  EXPECT_TRUE(upper.ok()) << upper;

  absl::Status s = EnsureModel("no_such_model", {PluginDir()});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(s), AllOf(HasSubstr("unknown model 'no_such_model'"),
                                HasSubstr("plugin_test_model"), HasSubstr("model.path"),
                                HasSubstr(PluginDir() + "/libbraid_no_such_model.so"),
                                HasSubstr("BRAID_PLUGIN_PATH")));
  // A plugin of that name that registers no such model says so.
  absl::Status misnamed = EnsureModel("test_misnamed", {PluginDir()});
  EXPECT_EQ(misnamed.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Message(misnamed), AllOf(HasSubstr("libbraid_test_misnamed.so"),
                                       HasSubstr("no model 'test_misnamed'")));
  // A name no plugin can have still lists the known models.
  absl::Status odd = EnsureModel("no such model", {PluginDir()});
  EXPECT_EQ(odd.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(odd), AllOf(HasSubstr("'no such model'"), HasSubstr("plugin_test_model")));
}

TEST(PluginTest, LoadAllPluginsLoadsEveryFileAndReportsTheBrokenOnes) {
  // Two folders: the first holds plugins flat and in a plugin folder, a broken file, a file
  // that is not a plugin and one that is not a Braid plugin; the second a second copy of a
  // name the first has (the first folder wins, as when loading by name).
  const std::string first = TempDir() + "/all_first", second = TempDir() + "/all_second";
  for (const std::string& d : {first, second, first + "/test_misnamed"}) ::mkdir(d.c_str(), 0755);
  auto link = [](const std::string& target, const std::string& at) {
    ::unlink(at.c_str());
    ASSERT_EQ(::symlink(target.c_str(), at.c_str()), 0) << at;
  };
  link(PluginPath("test_good"), first + "/libbraid_test_good.so");
  link(PluginPath("test_misnamed"), first + "/test_misnamed/libbraid_test_misnamed.so");
  link(PluginPath("test_no_entry"), first + "/libbraid_test_no_entry.so");
  std::ofstream(first + "/libbraid_all_junk.so") << "not an ELF file\n";
  std::ofstream(first + "/README") << "not a plugin\n";
  // A real copy (another canonical path): loading it would register "test_good" twice.
  {
    std::ifstream in(PluginPath("test_good"), std::ios::binary);
    std::ofstream(second + "/libbraid_test_good.so", std::ios::binary) << in.rdbuf();
  }

  PluginScan scan = LoadAllPlugins({"/nonexistent/braid", first, second});
  std::vector<std::string> loaded;
  for (const std::string& p : scan.loaded) loaded.push_back(p.substr(p.rfind('/') + 1));
  std::sort(loaded.begin(), loaded.end());
  EXPECT_EQ(loaded, (std::vector<std::string>{"libbraid_test_good.so",
                                              "libbraid_test_misnamed.so"}));
  std::vector<std::string> failed;
  for (const absl::Status& f : scan.failed) failed.push_back(Message(f));
  EXPECT_THAT(failed, ::testing::UnorderedElementsAre(
                          AllOf(HasSubstr("libbraid_all_junk.so"), HasSubstr("dlopen failed")),
                          AllOf(HasSubstr("libbraid_test_no_entry.so"),
                                HasSubstr(BRAID_PLUGIN_ABI_VERSION_SYMBOL))));
  EXPECT_TRUE(Registry::Get().HasStrategy("test_good"));
  EXPECT_TRUE(Registry::Get().HasStrategy("test_misnamed_strategy"));

  // Again: nothing registers twice; the broken files are reported again.
  PluginScan again = LoadAllPlugins({first, second});
  EXPECT_EQ(again.loaded.size(), 2u);
  EXPECT_EQ(again.failed.size(), 2u);
  EXPECT_TRUE(LoadAllPlugins({}).loaded.empty());
}

TEST(RegistryTest, AddStrategyRejectsDuplicatesNamingBothOrigins) {
  auto factory = [] { return std::unique_ptr<Strategy>(); };
  ASSERT_TRUE(Registry::Get().AddStrategy("registry_test_a", factory, "first origin").ok());
  absl::Status s = Registry::Get().AddStrategy("registry_test_a", factory, "second origin");
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(Message(s), AllOf(HasSubstr("first origin"), HasSubstr("second origin")));
  EXPECT_FALSE(Registry::Get().AddStrategy("", factory).ok());
  EXPECT_FALSE(Registry::Get().AddStrategy("registry_test_b", nullptr).ok());
  // A factory returning null is reported, not handed out.
  absl::StatusOr<std::unique_ptr<Strategy>> made = Registry::Get().MakeStrategy("registry_test_a");
  EXPECT_EQ(made.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(Message(made.status()), HasSubstr("first origin"));
}

}  // namespace
}  // namespace braid
