#include "text/tool_calls.h"

#include <array>

#include "text/tool_call_syntax.h"
#include "text/utf8.h"

namespace tpcli::text {

namespace {

using tool_syntax::Opener;
using tool_syntax::Syntax;
using tool_values::is_space;
using tool_values::ScanStatus;

// ---- names ----

struct FormatName {
  ToolCallFormat format;
  std::string_view name;                     // the --tool-parser name
  std::array<std::string_view, 3> aliases;  // the enumerator, and other servers' spellings
};

constexpr std::array<FormatName, 17> FORMAT_NAMES = {{
    {ToolCallFormat::hermes, "hermes", {"qwen", "qwen2_5"}},
    {ToolCallFormat::llama3_json, "llama3_json", {"llama4_json", "llama_3_x"}},
    {ToolCallFormat::mistral, "mistral", {"magistral", "devstral"}},
    {ToolCallFormat::pythonic, "pythonic", {"llama4_pythonic", "lfm2"}},
    {ToolCallFormat::functionary_v3_1, "functionary_v3_1", {"functionary_v3_1_llama_3_1"}},
    {ToolCallFormat::functionary_v3_2, "functionary_v3_2", {}},
    {ToolCallFormat::granite, "granite", {}},
    {ToolCallFormat::phi4_mini, "phi4_mini_json", {"phi4_mini"}},
    {ToolCallFormat::firefunction_v2, "firefunction_v2", {}},
    {ToolCallFormat::deepseek_v3_1, "deepseek_v31", {"deepseek_v3_1", "deepseek_v3", "deepseek_r1"}},
    {ToolCallFormat::qwen3_coder, "qwen3_coder", {"qwen3_xml"}},
    {ToolCallFormat::command_r, "command_r", {"command_r7b", "command_r_plus"}},
    {ToolCallFormat::kimi_k2, "kimi_k2", {}},
    {ToolCallFormat::internlm2, "internlm", {"internlm2"}},
    {ToolCallFormat::gpt_oss, "openai", {"gpt_oss", "harmony"}},
    {ToolCallFormat::glm4_5, "glm45", {"glm4_5", "glm4_moe", "glm46"}},
    {ToolCallFormat::seed_oss, "seed_oss", {}},
}};

bool contains(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

// ---- content: the text outside calls ----

// Each stretch of content between calls trimmed, stretches joined by one newline, never a partial
// UTF-8 character: whitespace is held until text follows it, a stretch's opening whitespace dropped.
class ContentWriter {
 public:
  void add(std::string_view text, std::string& out) {
    for (char c : text) {
      if (is_space(c)) {
        if (written_any_ && !after_call_) held_space_ += c;
        continue;
      }
      if (after_call_) pending_ += '\n';
      pending_ += held_space_;
      held_space_.clear();
      pending_ += c;
      written_any_ = true, after_call_ = false;
    }
    const size_t cut = pending_.size() - utf8::incomplete_tail(pending_);
    out.append(pending_, 0, cut);
    pending_.erase(0, cut);
  }
  void call_written() {
    held_space_.clear();
    after_call_ = written_any_;
  }
  void finish(std::string& out) {
    out += pending_;  // an incomplete character at the very end: as the model wrote it
    pending_.clear();
  }

 private:
  std::string pending_;     // written, held back until it ends on a character boundary
  std::string held_space_;  // whitespace that is content only if more content follows
  bool written_any_ = false;
  bool after_call_ = false;  // a call came since the last content: the next content opens a new stretch
};

// The earliest opener in `text` a call may start at (ties: the longest opener).
struct OpenerAt {
  size_t position;
  const Opener* opener;
};
std::optional<OpenerAt> find_opener(const Syntax& syntax, std::string_view text, bool at_start) {
  std::optional<OpenerAt> best;
  const size_t first_text = tool_values::skip_space(text, 0);
  for (const Opener& opener : syntax.openers) {
    size_t at;
    if (opener.at_start_only) {
      if (!at_start || first_text >= text.size()) continue;
      if (text.substr(first_text, opener.text.size()) != opener.text) continue;
      at = first_text;
    } else {
      at = text.find(opener.text);
      if (at == std::string_view::npos) continue;
    }
    if (!best || at < best->position || (at == best->position && opener.text.size() > best->opener->text.size()))
      best = OpenerAt{at, &opener};
  }
  return best;
}

// Bytes at the end of `text` that may begin an opener once more text arrives.
size_t possible_opener_tail(const Syntax& syntax, std::string_view text, bool at_start) {
  size_t tail = 0;
  for (const Opener& opener : syntax.openers) {
    if (opener.at_start_only) {
      const size_t first_text = tool_values::skip_space(text, 0);
      const std::string_view rest = text.substr(first_text);
      if (at_start && rest.size() < opener.text.size() + (opener.text.empty() ? 1 : 0) &&
          std::string_view(opener.text).substr(0, rest.size()) == rest)
        tail = std::max(tail, text.size());
      continue;
    }
    for (size_t k = std::min(opener.text.size() - 1, text.size()); k > tail; --k)
      if (text.substr(text.size() - k) == std::string_view(opener.text).substr(0, k)) {
        tail = k;
        break;
      }
  }
  return tail;
}

}  // namespace

std::optional<ToolCallFormat> tool_call_format_named(std::string_view name) {
  for (const FormatName& f : FORMAT_NAMES) {
    if (name == f.name) return f.format;
    for (std::string_view alias : f.aliases)
      if (!alias.empty() && name == alias) return f.format;
  }
  return std::nullopt;
}

std::string tool_call_format_name(ToolCallFormat format) {
  for (const FormatName& f : FORMAT_NAMES)
    if (f.format == format) return std::string(f.name);
  return "?";
}

std::string tool_call_format_names() {
  std::string names;
  for (const FormatName& f : FORMAT_NAMES) names += (names.empty() ? "" : ", ") + std::string(f.name);
  return names;
}

std::optional<ToolCallFormat> tool_call_format_of_template(std::string_view source) {
  // Most specific markers first: Qwen3-Coder and Seed-OSS write "<function=" too, GLM "<tool_call>".
  if (contains(source, "<|tool_calls_section_begin|>")) return ToolCallFormat::kimi_k2;
  if (contains(source, "tool▁calls▁begin")) return ToolCallFormat::deepseek_v3_1;
  if (contains(source, "<seed:tool_call>")) return ToolCallFormat::seed_oss;
  if (contains(source, "<arg_key>")) return ToolCallFormat::glm4_5;
  if (contains(source, "<parameter=")) return ToolCallFormat::qwen3_coder;
  if (contains(source, "<function=")) return ToolCallFormat::functionary_v3_1;
  if (contains(source, "<|action_start|>")) return ToolCallFormat::internlm2;
  if (contains(source, "[TOOL_CALLS]")) return ToolCallFormat::mistral;
  if (contains(source, "<|tool_call|>")) return ToolCallFormat::granite;
  if (contains(source, "' functools['")) return ToolCallFormat::firefunction_v2;
  if (contains(source, "functools[")) return ToolCallFormat::phi4_mini;
  if ((contains(source, "Action:") && contains(source, "tool_name")) || contains(source, "<|START_ACTION|>")) return ToolCallFormat::command_r;
  if (contains(source, ">>>") && contains(source, "tool_calls")) return ToolCallFormat::functionary_v3_2;
  if (contains(source, "<|channel|>") && contains(source, "to=")) return ToolCallFormat::gpt_oss;
  if (contains(source, "<tool_call>")) return ToolCallFormat::hermes;
  if (contains(source, "<|tool_call_start|>") || contains(source, "<|tool_list_start|>")) return ToolCallFormat::pythonic;
  if (contains(source, "tool_calls") && (contains(source, ".name + '('") || contains(source, ".name + \"(\"")))
    return ToolCallFormat::pythonic;
  if (contains(source, "tool_calls") && (contains(source, "<|python_tag|>") || contains(source, "\"parameters\": ")))
    return ToolCallFormat::llama3_json;
  return std::nullopt;
}

std::string tool_call_id(uint64_t seed, int index) {
  static constexpr std::string_view ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  uint64_t state = seed ^ (0x9E3779B97F4A7C15ull * (static_cast<uint64_t>(index) + 1));
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) {  // splitmix64
    state += 0x9E3779B97F4A7C15ull;
    uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    id += ALPHABET[z % ALPHABET.size()];
  }
  return id;
}

// ---- the stream ----

constexpr size_t LONG_BLOCK = 4096;  // bytes

struct ToolCallStream::State {
  const Syntax* syntax;
  nlohmann::json tools;
  std::string undecided;                  // text not yet content or calls; starts at the open block's opener
  const Opener* open_block = nullptr;     // the opener of the block being read
  size_t block_scanned = 0;               // its bytes when block_end last found it incomplete
  bool at_start = true;                   // nothing but whitespace decided so far
  ContentWriter content;
  int next_index = 0;

  void write_content(std::string_view text, ReplyDelta& out) {
    for (char c : text)
      if (!is_space(c)) at_start = false;
    content.add(text, out.content);
  }

  // Decides as much of `undecided` as the text so far allows.
  void advance(bool text_ended, ReplyDelta& out) {
    for (;;) {
      if (open_block == nullptr) {
        if (auto found = find_opener(*syntax, undecided, at_start)) {
          write_content(std::string_view(undecided).substr(0, found->position), out);
          undecided.erase(0, found->position);
          open_block = found->opener;
          continue;
        }
        const size_t keep = text_ended ? 0 : possible_opener_tail(*syntax, undecided, at_start);
        write_content(std::string_view(undecided).substr(0, undecided.size() - keep), out);
        undecided.erase(0, undecided.size() - keep);
        return;
      }
      const std::string& opener = open_block->text;
      // block_end reads the whole block: a long one (a file written as an argument) is read again
      // only once it has grown by a quarter, so that reading it stays linear in its length. Its
      // answers do not depend on when it is asked, so the reply is the same, only later released.
      if (!text_ended && undecided.size() > LONG_BLOCK && undecided.size() < block_scanned + block_scanned / 4) return;
      tool_values::ValueScan end = syntax->block_end(opener, undecided, text_ended);
      if (end.status == ScanStatus::incomplete && !text_ended) {
        block_scanned = undecided.size();
        return;
      }
      open_block = nullptr;
      block_scanned = 0;
      if (end.status != ScanStatus::complete || (end.length == 0 && opener.empty())) {
        // Not a call after all: the opener is content, and the search goes on after it.
        at_start = false;
        write_content(opener, out);
        undecided.erase(0, opener.size());
        continue;
      }
      const std::string_view block = std::string_view(undecided).substr(0, end.length);
      if (auto parsed = syntax->parse(opener, block, tools)) {
        at_start = false;
        write_content(parsed->content, out);
        for (auto& call : parsed->calls) {
          content.call_written();
          out.tool_calls.push_back({next_index++, std::move(call.name), std::move(call.arguments)});
        }
      } else {
        write_content(block, out);
      }
      at_start = false;
      undecided.erase(0, end.length);
    }
  }
};

ToolCallStream::ToolCallStream(ToolCallFormat format, const nlohmann::json& tools)
    : state_(std::make_unique<State>(State{&tool_syntax::syntax_of(format), tools})) {}
ToolCallStream::~ToolCallStream() = default;
ToolCallStream::ToolCallStream(ToolCallStream&&) noexcept = default;
ToolCallStream& ToolCallStream::operator=(ToolCallStream&&) noexcept = default;

ReplyDelta ToolCallStream::feed(std::string_view text) {
  ReplyDelta out;
  state_->undecided += text;
  state_->advance(false, out);
  return out;
}

ReplyDelta ToolCallStream::finish() {
  ReplyDelta out;
  state_->advance(true, out);
  state_->content.finish(out.content);
  return out;
}

AssistantReply parse_tool_calls(ToolCallFormat format, std::string_view generated, const nlohmann::json& tools) {
  ToolCallStream stream(format, tools);
  AssistantReply reply;
  for (ReplyDelta delta : {stream.feed(generated), stream.finish()}) {
    reply.content += delta.content;
    for (auto& call : delta.tool_calls) reply.tool_calls.push_back({"", std::move(call.name), std::move(call.arguments_fragment)});
  }
  return reply;
}

}  // namespace tpcli::text
