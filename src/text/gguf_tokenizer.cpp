// tpcli::text — the tokenizer of a GGUF file's metadata (see gguf_tokenizer.h).
#include "text/gguf_tokenizer.h"

#include <algorithm>
#include <list>
#include <nlohmann/json.hpp>
#include <queue>
#include <stdexcept>

#include "files/json_file.h"
#include "text/utf8.h"

namespace tpcli::text {

using files::quoted_value;

namespace {

// llama.cpp's token attributes (llama.h: llama_token_attr).
constexpr uint32_t ATTR_UNKNOWN = 1u << 0, ATTR_UNUSED = 1u << 1, ATTR_NORMAL = 1u << 2, ATTR_CONTROL = 1u << 3,
                   ATTR_USER_DEFINED = 1u << 4, ATTR_BYTE = 1u << 5, ATTR_LSTRIP = 1u << 7, ATTR_RSTRIP = 1u << 8;

// tokenizer.ggml.token_type values (gguf-py's TokenType) as attributes; anything else is undefined (0).
uint32_t attribute_of_type(int type) {
  switch (type) {
    case 1: return ATTR_NORMAL;
    case 2: return ATTR_UNKNOWN;
    case 3: return ATTR_CONTROL;
    case 4: return ATTR_USER_DEFINED;
    case 5: return ATTR_UNUSED;
    case 6: return ATTR_BYTE;
    default: return 0;
  }
}

const std::string SPACE_MARK = "\xE2\x96\x81";  // "▁", SentencePiece's space

// ---- llama.cpp's pre-tokenizers (llm_tokenizer_bpe), by tokenizer.ggml.pre ----

const char* const GPT2_WORDS = R"re('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))re";
const char* const LLAMA3_WORDS =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
const char* const QWEN2_WORDS =
    R"re((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
const char* const PORO_WORDS = R"re( ?[^(\s|.,!?…。，、।۔،)]+)re";
// Upper- and lower-case runs written with lookaheads, as llama.cpp adapts tokenizer.json's \p{Lu} / \p{Ll}.
const char* const TEKKEN_WORDS =
    R"re([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
const char* const GPT4O_WORDS =
    R"re([^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";
// DeepSeek LLM's cased letters, by code point: written as UTF-8 some of them (OHM SIGN, KELVIN SIGN,
// Greek oxia forms) would not survive an editor's Unicode normalization.
const char* const DEEPSEEK_LLM_LETTERS =
    R"re(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)re";
const char* const DEEPSEEK_V3_WORDS =
    R"re([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)re";

struct PreTokenizerRule {
  std::vector<std::string> names;  // tokenizer.ggml.pre values
  std::vector<std::string> regexes;
  bool ignore_merges = false;      // a piece that is a token is that token
  bool add_bos = false;            // the default of tokenizer.ggml.add_bos_token
  bool clean_spaces = true;        // detokenizing removes spaces before punctuation
};

const std::vector<PreTokenizerRule>& pre_tokenizer_rules() {
  static const std::vector<PreTokenizerRule> rules = {
      {{"default"}, {R"re([\p{P}\$\+<=>\^~\|]+)re", GPT2_WORDS, R"re(\p{N}+)re", "[0-9][0-9][0-9]"}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"}, {LLAMA3_WORDS}, true, true},
      {{"dbrx", "smaug-bpe"}, {LLAMA3_WORDS}},
      {{"deepseek-llm"},
       {"[\\r\\n]", DEEPSEEK_LLM_LETTERS, R"re(\s?[!-/:-~！-／：-～‘-‟　-。]+)re", R"re(\s+$)re", "[一-龥ࠀ-一가-퟿]+", R"re(\p{N}+)re"},
       false, false, false},
      {{"deepseek-coder"}, {"[\\r\\n]", R"re(\s?\p{L}+)re", R"re(\s?\p{P}+)re", "[一-龥ࠀ-一가-퟿]+", R"re(\p{N})re"}, false, false, false},
      {{"deepseek-v3"}, {R"re(\p{N}{1,3})re", "[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK_V3_WORDS}, false, false, false},
      {{"falcon"}, {R"re([\p{P}\$\+<=>\^~\|`]+)re", GPT2_WORDS, "[0-9][0-9][0-9]"}},
      {{"starcoder", "refact", "codeshell", "exaone", "minerva-7b"}, {R"re(\p{N})re", GPT2_WORDS}},
      {{"command-r", "smollm"}, {R"re(\p{N})re", GPT2_WORDS}, false, false, false},
      {{"gpt-2", "gpt2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code",
        "roberta-bpe", "mpt", "olmo", "jais"},
       {GPT2_WORDS}},
      {{"trillion"}, {GPT2_WORDS}, false, false, false},
      {{"qwen2", "deepseek-r1-qwen"}, {QWEN2_WORDS}, false, false, false},
      {{"stablelm2", "megrez"}, {QWEN2_WORDS}},
      {{"poro-chat"}, {PORO_WORDS}, false, false, false},
      {{"bloom", "gpt3-finnish"}, {PORO_WORDS}},
      {{"chatglm-bpe", "glm4"}, {LLAMA3_WORDS}},  // and no default BOS (set_special_ids)
      {{"viking"}, {PORO_WORDS, R"re(\p{N})re"}, false, false, false},
      {{"tekken"}, {TEKKEN_WORDS}, true, true, false},
      {{"chameleon"},
       {"<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", R"re(\p{N})re",
        R"re([\p{P}!-/:-@\[-`{-~])re", GPT2_WORDS},
       false, true, false},
      {{"gpt-4o", "llama4"}, {GPT4O_WORDS}, false, false, false},
  };
  return rules;
}

const PreTokenizerRule* find_pre_rule(const std::string& name) {
  for (const PreTokenizerRule& rule : pre_tokenizer_rules())
    if (std::ranges::count(rule.names, name)) return &rule;
  return nullptr;
}

std::string known_pre_names() {
  std::string names;
  for (const PreTokenizerRule& rule : pre_tokenizer_rules())
    for (const std::string& name : rule.names) names += (names.empty() ? "" : ", ") + name;
  return names;
}

// llama.cpp's text for end-of-turn and fill-in-the-middle tokens: such a token is a control token,
// whatever its type says (so plain text never spells it), and the first of each list fills its id
// when the file names none.
const std::vector<std::string> EOT_TEXTS = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
                                            "<EOT>", "_<EOT>", "<｜end▁of▁sentence｜>"};
const std::vector<std::string> EOM_TEXTS = {"<|eom_id|>"};
const std::vector<std::vector<std::string>> FIM_TEXTS = {
    {"<|fim_prefix|>", "<fim-prefix>", "<｜fim▁begin｜>", "<PRE>"},
    {"<|fim_suffix|>", "<fim-suffix>", "<｜fim▁hole｜>", "<SUF>"},
    {"<|fim_middle|>", "<fim-middle>", "<｜fim▁end｜>", "<MID>"},
    {"<|fim_pad|>", "<fim-pad>", "<PAD>"},
    {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>"},
    {"<|file_sep|>", "<fim-file-sep>", "<FILE_SEP>"},
};
// Tokens that end generation by their text.
const std::vector<std::string> END_OF_GENERATION_TEXTS = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>",
                                                          "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>"};

// llama.cpp's unicode_len_utf8: the length a lead byte announces (1 for a continuation byte).
size_t utf8_length(char lead) {
  static constexpr size_t LENGTHS[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return LENGTHS[static_cast<unsigned char>(lead) >> 4];
}

bool is_ascii_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

std::string lower_ascii(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return s;
}

// `text` with each byte that does not start a valid UTF-8 character read as U+FFFD, one per byte
// (llama.cpp's unicode_cpts_from_utf8).
std::string replace_invalid_utf8(std::string_view text) {
  if (utf8::is_valid(text)) return std::string(text);
  std::string out;
  for (size_t at = 0; at < text.size();) {
    const utf8::CodePoint cp = utf8::decode(text, at);
    if (cp.valid) {
      out.append(text.substr(at, static_cast<size_t>(cp.length)));
      at += static_cast<size_t>(cp.length);
    } else {
      utf8::append(out, 0xFFFD);
      at += 1;
    }
  }
  return out;
}

// llama.cpp's clean-up of detokenized text: " ?", " !", " .", " ," lose the space; " ' " between
// spaces loses both; " 's", " 'm", " 're", " 've" lose the space.
std::string clean_up_spaces(const std::string& text) {
  std::string a;
  for (size_t i = 0; i < text.size(); ++i) {
    const char x = text[i];
    if (i > 0 && text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',') && !a.empty()) a.pop_back();
    a += x;
  }
  std::string b;
  for (size_t i = 0; i < a.size(); ++i) {
    const char x = a[i];
    if (i > 0 && x == '\'' && i + 1 < a.size() && a[i - 1] == ' ' && a[i + 1] == ' ') {
      if (!b.empty()) b.pop_back();
      b += x;
      ++i;  // the space after it
      continue;
    }
    b += x;
  }
  std::string c;
  for (size_t i = 0; i < b.size(); ++i) {
    const char x = b[i];
    if (i > 0 && b[i - 1] == ' ' && x == '\'' && i + 1 < b.size()) {
      const char x1 = b[i + 1];
      const char x2 = i + 2 < b.size() ? b[i + 2] : '\0';
      const bool drop = x1 == 's' || x1 == 'm' || (i + 2 < b.size() && ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')));
      if (drop && !c.empty()) c.pop_back();
    }
    c += x;
  }
  return c;
}

}  // namespace

GgufTokenizer::~GgufTokenizer() = default;

GgufTokenizer::GgufTokenizer(const GgufVocabulary& v) : origin_(v.origin), tokens_(v.tokens) {
  if (v.model == "llama") {
    kind_ = Kind::sentencepiece;
  } else if (v.model == "gpt2") {
    kind_ = Kind::byte_level_bpe;
  } else {
    throw std::runtime_error(origin_ + ": tokenizer.ggml.model = " + quoted_value(v.model) +
                             " is not a tokenizer tpcli reads (\"llama\" SentencePiece, \"gpt2\" byte-level BPE)");
  }
  if (tokens_.empty()) throw std::runtime_error(origin_ + ": tokenizer.ggml.tokens: missing or empty");
  const size_t n = tokens_.size();
  if (!v.scores.empty() && v.scores.size() < n)
    throw std::runtime_error(origin_ + ": tokenizer.ggml.scores holds " + std::to_string(v.scores.size()) + " values for " +
                             std::to_string(n) + " tokens");
  if (!v.token_types.empty() && v.token_types.size() < n)
    throw std::runtime_error(origin_ + ": tokenizer.ggml.token_type holds " + std::to_string(v.token_types.size()) +
                             " values for " + std::to_string(n) + " tokens");
  scores_.assign(n, 0.0f);
  if (!v.scores.empty()) std::copy_n(v.scores.begin(), n, scores_.begin());
  ids_.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) ids_[tokens_[i]] = static_cast<int>(i);  // the last of equal texts, as llama.cpp b4748
  set_pre_tokenizer(v);
  set_special_ids(v);
  set_attributes(v);
}

void GgufTokenizer::set_pre_tokenizer(const GgufVocabulary& v) {
  if (kind_ == Kind::sentencepiece) {
    add_bos_ = true;
    add_space_prefix_ = true;
    clean_spaces_ = false;
  } else {
    // llama.cpp reads a file without tokenizer.ggml.pre with the "default" regexes.
    const std::string pre = v.pre.value_or("default");
    const PreTokenizerRule* rule = find_pre_rule(pre);
    if (!rule)
      throw std::runtime_error(origin_ + ": tokenizer.ggml.pre = " + quoted_value(pre) +
                               " is not a pre-tokenizer llama.cpp knows (known: " + known_pre_names() + ")");
    add_bos_ = rule->add_bos;
    clean_spaces_ = rule->clean_spaces;

    nlohmann::json pieces = nlohmann::json::array();
    for (const std::string& regex : rule->regexes)
      pieces.push_back({{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}});
    pieces.push_back({{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}});
    pre_tokenizer_ = hf::make_pre_tokenizer({{"type", "Sequence"}, {"pretokenizers", pieces}}, origin_ + ": tokenizer.ggml.pre " + pre);

    // llama.cpp merges pairs of texts; the model keeps those whose parts and result are tokens (a
    // merge into a text that is no token could never give one).
    if (!v.merges) throw std::runtime_error(origin_ + ": tokenizer.ggml.merges: missing (a \"gpt2\" tokenizer needs its merges)");
    std::vector<std::pair<std::string, std::string>> merges;
    merges.reserve(v.merges->size());
    for (size_t rank = 0; rank < v.merges->size(); ++rank) {
      const std::string& merge = (*v.merges)[rank];
      const size_t space = merge.find(' ', 1);
      if (space == std::string::npos)
        throw std::runtime_error(origin_ + ": tokenizer.ggml.merges[" + std::to_string(rank) + "] = " + quoted_value(merge) +
                                 " is not two tokens separated by a space");
      merges.emplace_back(merge.substr(0, space), merge.substr(space + 1));
    }
    bpe_ = std::make_unique<hf::BpeModel>(tokens_, merges, rule->ignore_merges);
  }
  if (v.add_space_prefix) add_space_prefix_ = *v.add_space_prefix;
}

void GgufTokenizer::set_special_ids(const GgufVocabulary& v) {
  const int n = vocab_size();
  const auto default_id = [&](int id) { return id < n ? std::optional<int>(id) : std::nullopt; };
  const bool chatglm = kind_ == Kind::byte_level_bpe && v.pre && (*v.pre == "chatglm-bpe" || *v.pre == "glm4");
  if (kind_ == Kind::sentencepiece) {
    bos_ = default_id(1), eos_ = default_id(2), unk_ = default_id(0);
  } else {
    bos_ = chatglm ? std::nullopt : default_id(11), eos_ = default_id(11), unk_ = std::nullopt;
  }
  // A key naming an id outside the vocabulary keeps the default, as llama.cpp does.
  const auto read = [&](const std::optional<int64_t>& key, std::optional<int>& id) {
    if (key && *key >= 0 && *key < n) id = static_cast<int>(*key);
  };
  read(v.bos_id, bos_);
  read(v.eos_id, eos_);
  read(v.eot_id, eot_);
  read(v.eom_id, eom_);
  read(v.unk_id, unk_);
  if (v.add_bos) add_bos_ = *v.add_bos;
  if (v.add_eos) add_eos_ = *v.add_eos;
  if (add_bos_ && !bos_)
    throw std::runtime_error(origin_ + ": tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id names no token");
  if (add_eos_ && !eos_)
    throw std::runtime_error(origin_ + ": tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id names no token");
}

void GgufTokenizer::set_attributes(const GgufVocabulary& v) {
  const int n = vocab_size();
  attributes_.assign(static_cast<size_t>(n), ATTR_NORMAL);
  if (!v.token_types.empty())
    for (int i = 0; i < n; ++i) attributes_[static_cast<size_t>(i)] = attribute_of_type(v.token_types[static_cast<size_t>(i)]);

  // End-of-turn and fill-in-the-middle spellings are control tokens (llama.cpp's "control-looking
  // token" rule); the first of a list found fills an id the file leaves unset.
  const auto detect = [&](const std::vector<std::string>& texts, std::optional<int>* id) {
    for (int i = 0; i < n; ++i) {
      if (id && *id) return;
      if (!std::ranges::count(texts, tokens_[static_cast<size_t>(i)])) continue;
      if (id) *id = i;
      attributes_[static_cast<size_t>(i)] |= ATTR_CONTROL;
      if (!id) return;
    }
  };
  detect(EOT_TEXTS, &eot_);
  detect(EOM_TEXTS, &eom_);
  for (const auto& texts : FIM_TEXTS) {
    std::optional<int> fim;
    detect(texts, &fim);
  }
  for (int i = 0; i < n; ++i) {
    if (!std::ranges::count(END_OF_GENERATION_TEXTS, tokens_[static_cast<size_t>(i)])) continue;
    end_of_generation_.push_back(i);
    attributes_[static_cast<size_t>(i)] |= ATTR_CONTROL;
  }
  for (const std::optional<int>& id : {eos_, eot_, eom_})
    if (id && !std::ranges::count(end_of_generation_, *id)) end_of_generation_.push_back(*id);

  for (int i = 0; i < n; ++i)
    if (attributes_[static_cast<size_t>(i)] & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN) && !tokens_[static_cast<size_t>(i)].empty())
      special_tokens_.push_back(i);
  std::ranges::stable_sort(special_tokens_, [&](int a, int b) {
    return tokens_[static_cast<size_t>(a)].size() > tokens_[static_cast<size_t>(b)].size();
  });

  // llama.cpp's per-model attributes: Phi-3 drops the spaces after its special tokens (but not
  // after <unk>, <s>, <|endoftext|>); jina-v2 drops them before <mask>.
  const std::string name = lower_ascii(v.general_name);
  const auto set = [&](const std::string& text, uint32_t attribute, bool on) {
    if (auto it = ids_.find(text); it != ids_.end()) {
      uint32_t& a = attributes_[static_cast<size_t>(it->second)];
      a = on ? (a | attribute) : (a & ~attribute);
    }
  };
  const std::string pre = v.pre.value_or("");
  if (pre.find("jina-v2-de") != std::string::npos || pre.find("jina-v2-es") != std::string::npos ||
      pre.find("jina-v2-code") != std::string::npos) {
    set("<mask>", ATTR_LSTRIP, true);
  } else if (name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos) {
    for (int id : special_tokens_) attributes_[static_cast<size_t>(id)] |= ATTR_RSTRIP;
    set("</s>", ATTR_RSTRIP, true);
    for (const char* text : {"<unk>", "<s>", "<|endoftext|>"}) set(text, ATTR_RSTRIP, false);
  }
}

bool GgufTokenizer::is_control(int id) const {
  return id >= 0 && id < vocab_size() && (attributes_[static_cast<size_t>(id)] & ATTR_CONTROL);
}

// llama.cpp's tokenizer_st_partition: for each special token, longest first, every text fragment
// is split at its occurrences, left to right.
std::vector<GgufTokenizer::Fragment> GgufTokenizer::split_at_special_tokens(std::string_view text, bool parse_special) const {
  std::list<Fragment> fragments;
  if (!text.empty()) fragments.push_back({0, text.size(), -1});
  for (const int id : special_tokens_) {
    const uint32_t attributes = attributes_[static_cast<size_t>(id)];
    if (!parse_special && (attributes & (ATTR_CONTROL | ATTR_UNKNOWN))) continue;
    const std::string& special = tokens_[static_cast<size_t>(id)];
    for (auto it = fragments.begin(); it != fragments.end();) {
      if (it->id >= 0) {
        ++it;
        continue;
      }
      size_t begin = it->begin;
      const size_t end = it->end;
      std::vector<Fragment> pieces;
      for (size_t match; begin < end && (match = text.substr(0, end).find(special, begin)) != std::string_view::npos;) {
        size_t left_end = match;
        if (attributes & ATTR_LSTRIP)
          while (left_end > begin && is_ascii_space(text[left_end - 1])) --left_end;
        if (left_end > begin) pieces.push_back({begin, left_end, -1});
        pieces.push_back({0, 0, id});
        begin = match + special.size();
        if (attributes & ATTR_RSTRIP)
          while (begin < end && is_ascii_space(text[begin])) ++begin;
      }
      if (pieces.empty()) {
        ++it;
        continue;
      }
      if (begin < end) pieces.push_back({begin, end, -1});
      it = fragments.erase(it);
      fragments.insert(it, pieces.begin(), pieces.end());
    }
  }
  return {fragments.begin(), fragments.end()};
}

std::vector<int> GgufTokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  std::vector<int> ids;
  if (add_special && add_bos_) ids.push_back(*bos_);
  bool after_special = true;  // SentencePiece: a space starts the text and each span after a special token
  for (const Fragment& f : split_at_special_tokens(text, parse_special)) {
    if (f.id >= 0) {
      ids.push_back(f.id);
      after_special = true;
      continue;
    }
    const std::string_view span = text.substr(f.begin, f.end - f.begin);
    if (kind_ == Kind::sentencepiece) {
      std::string spaced = add_space_prefix_ && after_special ? " " : "";
      spaced += span;
      encode_sentencepiece(utf8::replace_all(spaced, " ", SPACE_MARK), ids);
    } else {
      encode_bpe(span, ids);
    }
    after_special = false;
  }
  if (add_special && add_eos_) ids.push_back(*eos_);
  return ids;
}

int GgufTokenizer::byte_token(unsigned char byte) const {
  static const char* const HEX = "0123456789ABCDEF";
  const std::string name = {'<', '0', 'x', HEX[byte >> 4], HEX[byte & 15], '>'};
  if (auto it = ids_.find(name); it != ids_.end()) return it->second;
  if (auto it = ids_.find(std::string(1, static_cast<char>(byte))); it != ids_.end()) return it->second;
  return unk_.value_or(-1);  // llama.cpp fails here; <unk> says the byte was there
}

// llama.cpp's llm_tokenizer_spm_session: characters merge into the best-scoring tokens; what is
// left that is no token (a single character) becomes bytes.
void GgufTokenizer::encode_sentencepiece(std::string_view text, std::vector<int>& out) const {
  struct Symbol {
    int prev, next;
    size_t begin, length;  // bytes of `text`; length 0 once merged into its left neighbour
  };
  std::vector<Symbol> symbols;
  for (size_t at = 0; at < text.size();) {
    const size_t length = std::min(utf8_length(text[at]), text.size() - at);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({index - 1, at + length == text.size() ? -1 : index + 1, at, length});
    at += length;
  }
  struct Bigram {
    float score;
    int left, right;
    size_t length;
    bool operator<(const Bigram& o) const { return score < o.score || (score == o.score && left > o.left); }
  };
  std::priority_queue<Bigram> queue;
  const auto consider = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t length = symbols[static_cast<size_t>(left)].length + symbols[static_cast<size_t>(right)].length;
    auto it = ids_.find(text.substr(symbols[static_cast<size_t>(left)].begin, length));
    if (it == ids_.end()) return;
    queue.push({scores_[static_cast<size_t>(it->second)], left, right, length});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) consider(i - 1, i);
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(b.left)];
    Symbol& right = symbols[static_cast<size_t>(b.right)];
    if (left.length == 0 || right.length == 0 || left.length + right.length != b.length) continue;  // stale
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = b.left;
    consider(left.prev, b.left);
    consider(b.left, left.next);
  }
  for (int i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) {
    const std::string_view piece = text.substr(symbols[static_cast<size_t>(i)].begin, symbols[static_cast<size_t>(i)].length);
    if (auto it = ids_.find(piece); it != ids_.end()) {
      out.push_back(it->second);
      continue;
    }
    for (char byte : piece)
      if (const int id = byte_token(static_cast<unsigned char>(byte)); id >= 0) out.push_back(id);
  }
}

void GgufTokenizer::encode_bpe(std::string_view text, std::vector<int>& out) const {
  std::vector<hf::Piece> pieces = pre_tokenizer_({hf::Piece{replace_invalid_utf8(text), true}});
  for (const hf::Piece& p : pieces) bpe_->encode_word(p.text, out);
}

std::string GgufTokenizer::piece(int id, bool special) const {
  if (id < 0 || id >= vocab_size()) return {};
  const uint32_t attributes = attributes_[static_cast<size_t>(id)];
  const std::string& text = tokens_[static_cast<size_t>(id)];
  if (!special && (attributes & (ATTR_UNKNOWN | ATTR_CONTROL))) return {};
  if (attributes & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED)) return text;
  if (attributes & ATTR_NORMAL) {
    if (kind_ == Kind::sentencepiece) return utf8::replace_all(text, SPACE_MARK, " ");
    std::string bytes;  // GPT-2's byte alphabet back to bytes
    for (size_t at = 0; at < text.size();) {
      const utf8::CodePoint cp = utf8::decode(text, at);
      const int byte = hf::unicode_to_byte(cp.value);
      if (byte >= 0) {
        bytes += static_cast<char>(byte);
      } else {  // llama.cpp's marker for a character outside the alphabet
        static const char* const HEX = "0123456789abcdef";
        bytes += "[UNK_BYTE_0x";
        for (size_t i = 0; i < static_cast<size_t>(cp.length); ++i) {
          const auto b = static_cast<unsigned char>(text[at + i]);
          bytes += HEX[b >> 4];
          bytes += HEX[b & 15];
        }
        bytes += text + "]";
      }
      at += static_cast<size_t>(cp.length);
    }
    return bytes;
  }
  if (attributes & ATTR_BYTE) {
    if (text.size() >= 5 && text.starts_with("<0x")) return std::string(1, static_cast<char>(std::stoi(text.substr(3, 2), nullptr, 16)));
    return {};
  }
  return {};  // unused and undefined tokens
}

std::string GgufTokenizer::decode(std::span<const int> ids, bool remove_special, bool unparse_special, bool clean_spaces) const {
  bool remove_space = add_space_prefix_;  // the space encode put before the text
  if (remove_special && add_bos_ && !ids.empty() && bos_ && ids.front() == *bos_) {
    remove_space = false;
    ids = ids.subspan(1);
  }
  if (remove_special && add_eos_ && !ids.empty() && eos_ && ids.back() == *eos_) ids = ids.first(ids.size() - 1);
  std::string text;
  for (const int id : ids) {
    std::string p = piece(id, unparse_special);
    if (remove_space && p.starts_with(' ')) p.erase(0, 1);
    remove_space = false;
    text += p;
  }
  return clean_spaces && clean_spaces_ ? clean_up_spaces(text) : text;
}

std::string GgufTokenizer::decode_ids(std::span<const int> ids, bool clean_up) const {
  return decode(ids, /*remove_special=*/false, /*unparse_special=*/true, clean_up);
}

std::string GgufTokenizer::token_text(int id) const {
  return id >= 0 && id < vocab_size() ? tokens_[static_cast<size_t>(id)] : std::string();
}

std::optional<int> GgufTokenizer::token_id(std::string_view text) const {
  auto it = ids_.find(text);
  return it == ids_.end() ? std::nullopt : std::optional<int>(it->second);
}

}  // namespace tpcli::text
