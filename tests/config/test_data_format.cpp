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

TEST_CASE("data.format = chat | completions | jsonl-text: JSONL path and val_path beside the config, fine-tuning keys, errors at the key") {
  TempDir dir;
  dir.write("train.jsonl", "{}\n");
  dir.write("val.jsonl", "{}\n");
  const std::string chat = dir.write("chat.toml", "[data]\nformat = \"chat\"\npath = \"train.jsonl\"\nval_path = \"val.jsonl\"\n"
                                                  "template = \"chatml\"\ntrain_on_prompt = true\ntruncate = true\n");
  const auto config = load_run_config(chat);
  CHECK(config.data.format == DataFormat::Chat);
  CHECK(tpcli::config::is_sft_format(config.data.format));
  CHECK(config.data.path == (dir.path() / "train.jsonl").string());
  CHECK(config.data.val_path == (dir.path() / "val.jsonl").string());
  CHECK(config.data.chat_template == "chatml");
  CHECK(config.data.train_on_prompt);
  CHECK(config.data.truncate);
  CHECK(load_run_config(dir.write("c.toml", "[data]\nformat = \"completions\"\npath = \"train.jsonl\"\n")).data.format ==
        DataFormat::Completions);
  const auto jsonl = load_run_config(dir.write("t.toml", "[data]\nformat = \"jsonl-text\"\npath = \"train.jsonl\"\n"));
  CHECK(jsonl.data.format == DataFormat::JsonlText);
  CHECK_FALSE(jsonl.data.train_on_prompt);
  CHECK(tpcli::config::to_string(DataFormat::JsonlText) == "jsonl-text");

  const std::string tmpl = dir.write("tmpl.toml", "[data]\nformat = \"completions\"\npath = \"train.jsonl\"\ntemplate = \"chatml\"\n");
  CHECK_THAT(error_of<ConfigError>([&] { load_run_config(tmpl); }),
             Catch::StartsWith(tmpl + ":4:12: data.template is for format = \"chat\""));
  dir.write("corpus.txt", "hello\n");
  const std::string text = dir.write("text.toml", "[data]\npath = \"corpus.txt\"\ntrain_on_prompt = true\n");
  CHECK_THAT(error_of<ConfigError>([&] { load_run_config(text); }),
             Catch::StartsWith(text + ":3:19: data.train_on_prompt is for the fine-tuning formats"));
  const std::string missing = dir.write("missing.toml", "[data]\nformat = \"chat\"\npath = \"train.jsonl\"\nval_path = \"nope.jsonl\"\n");
  CHECK_THAT(error_of<ConfigError>([&] { load_run_config(missing); }), Catch::StartsWith(missing + ":4:"));
}
