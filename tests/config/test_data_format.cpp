// [data] format = "shards": path and val_path are glob patterns resolved beside the config first,
// then in the current directory; patterns that match nothing, an unknown format and a val_path on a
// text corpus are errors at the key's position.
#include <catch2/catch.hpp>
#include <functional>
#include <string>

#include "config/run_config.h"
#include "support/error_of.h"
#include "support/temp_dir.h"

using tpcli::config::ConfigError;
using tpcli::config::DataFormat;
using tpcli::config::load_run_config;
using tpcli::testing::TempDir;
using tpcli::testing::error_of;

TEST_CASE("data.format = shards: globs resolved beside the config, errors at the key") {
  TempDir dir;
  dir.write("shards/a_train_000000.bin", "x");
  dir.write("shards/a_train_000001.bin", "x");
  dir.write("shards/a_val_000000.bin", "x");
  const std::string good = dir.write("run.toml", "[data]\nformat = \"shards\"\npath = \"shards/*_train_*.bin\"\n"
                                                 "val_path = \"shards/*_val_*.bin\"\ntokenizer = \"bytes\"\n");
  const auto config = load_run_config(good);
  CHECK(config.data.format == DataFormat::Shards);
  CHECK(config.data.path == (dir.path() / "shards/*_train_*.bin").string());
  CHECK(config.data.val_path == (dir.path() / "shards/*_val_*.bin").string());
  CHECK(config.data.tokenizer_given);

  const std::string none = dir.write("none.toml", "[data]\nformat = \"shards\"\npath = \"shards/*_test_*.bin\"\n");
  CHECK_THAT(error_of<ConfigError>([&] { load_run_config(none); }),
             Catch::StartsWith(none + ":3:8: data.path = \"shards/*_test_*.bin\" matches no file"));
  const std::string format = dir.write("format.toml", "[data]\nformat = \"parquet\"\n");
  CHECK_THAT(error_of<ConfigError>([&] { load_run_config(format); }), Catch::StartsWith(format + ":2:10: data.format"));
  dir.write("corpus.txt", "hello\n");
  const std::string text = dir.write("text.toml", "[data]\npath = \"corpus.txt\"\nval_path = \"corpus.txt\"\n");
  CHECK_THAT(error_of<ConfigError>([&] { load_run_config(text); }),
             Catch::StartsWith(text + ":3:12: data.val_path is for format = \"shards\""));
}
