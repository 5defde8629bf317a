#include "controller/gateway/openai/output_parser.h"

#include <algorithm>
#include <utility>

#include "controller/gateway/openai/ids.h"
#include "controller/gateway/openai/python_literal.h"

namespace glm::openai {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kThinkOpen = "<think>";
constexpr std::string_view kThinkClose = "</think>";
constexpr std::string_view kCallOpen = "<tool_call>";
constexpr std::string_view kCallClose = "</tool_call>";
constexpr std::string_view kKeyOpen = "<arg_key>";
constexpr std::string_view kKeyClose = "</arg_key>";
constexpr std::string_view kValueOpen = "<arg_value>";
constexpr std::string_view kValueClose = "</arg_value>";
constexpr std::string_view kStopMarkers[] = {"<|observation|>", "<|user|>", "<|endoftext|>"};

constexpr std::string_view kSpace = " \t\r\n\v\f";

bool IsStopMarker(std::string_view marker) {
  return std::find(std::begin(kStopMarkers), std::end(kStopMarkers), marker) !=
         std::end(kStopMarkers);
}

std::string_view Strip(std::string_view text) {
  size_t begin = text.find_first_not_of(kSpace);
  if (begin == std::string_view::npos) return {};
  size_t end = text.find_last_not_of(kSpace);
  return text.substr(begin, end - begin + 1);
}

// Strip, also removing literal "\n" (backslash, n) text that models put around names.
std::string_view StripName(std::string_view text) {
  while (true) {
    std::string_view stripped = Strip(text);
    if (stripped.substr(0, 2) == "\\n") {
      text = stripped.substr(2);
    } else if (stripped.size() >= 2 && stripped.substr(stripped.size() - 2) == "\\n") {
      text = stripped.substr(0, stripped.size() - 2);
    } else {
      return stripped;
    }
  }
}

// Length of the end of `text` that begins a UTF-8 sequence not yet complete (0 when none).
size_t IncompleteUtf8Tail(std::string_view text) {
  size_t n = text.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    unsigned char c = static_cast<unsigned char>(text[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back
    size_t need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c < 0xF0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 1;
    return need > back ? back : 0;
  }
  return 0;
}

// The JSON string escape of `text` without the quotes (json.dumps(text)[1:-1]).
std::string EscapeJsonContent(std::string_view text) {
  std::string quoted = Json(std::string(text)).dump(-1, ' ', false, Json::error_handler_t::replace);
  return quoted.substr(1, quoted.size() - 2);
}

std::string QuoteJson(std::string_view text) {
  return Json(std::string(text)).dump(-1, ' ', false, Json::error_handler_t::replace);
}

// Whether a JSON Schema property takes only strings (null aside): type "string", a type list of
// "string" and "null", an enum of strings, or anyOf / oneOf branches that all qualify.
bool IsStringSchema(const Json& schema, int depth = 0) {
  if (!schema.is_object() || depth > 8) return false;
  if (auto type = schema.find("type"); type != schema.end()) {
    if (type->is_string()) return *type == "string";
    if (type->is_array()) {
      bool any_string = false;
      for (const Json& t : *type) {
        if (t == "string") {
          any_string = true;
        } else if (t != "null") {
          return false;
        }
      }
      return any_string;
    }
    return false;
  }
  if (auto values = schema.find("enum"); values != schema.end() && values->is_array()) {
    bool any = false;
    for (const Json& v : *values) {
      if (!v.is_string() && !v.is_null()) return false;
      any = any || v.is_string();
    }
    return any;
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    auto branches = schema.find(key);
    if (branches == schema.end() || !branches->is_array() || branches->empty()) continue;
    bool any_string = false;
    for (const Json& branch : *branches) {
      if (branch.is_object() && branch.value("type", Json()) == "null") continue;
      if (!IsStringSchema(branch, depth + 1)) return false;
      any_string = true;
    }
    return any_string;
  }
  return false;
}

}  // namespace

OutputParser::OutputParser(ParserOptions options)
    : options_(std::move(options)),
      state_(options_.reasoning && options_.starts_in_reasoning ? State::kReasoning
                                                                : State::kContent) {
  if (!options_.new_tool_call_id) {
    options_.new_tool_call_id = [] { return NewId("chatcmpl-tool-"); };
  }
}

// The markers each state acts on; everything else is text of that state.
const std::vector<std::string_view>& OutputParser::Markers() const {
  static const std::vector<std::string_view> kNone;
  auto with_stops = [](std::vector<std::string_view> markers) {
    markers.insert(markers.end(), std::begin(kStopMarkers), std::end(kStopMarkers));
    return markers;
  };
  static const std::vector<std::string_view> kReasoningMarkers =
      with_stops({kThinkClose, kThinkOpen, kCallOpen});
  static const std::vector<std::string_view> kContentMarkers[2][2] = {
      {with_stops({}), with_stops({kCallOpen})},
      {with_stops({kThinkOpen, kThinkClose}), with_stops({kThinkOpen, kThinkClose, kCallOpen})}};
  static const std::vector<std::string_view> kNameMarkers =
      with_stops({kKeyOpen, kCallClose, kCallOpen});
  static const std::vector<std::string_view> kKeyMarkers =
      with_stops({kKeyClose, kCallClose, kCallOpen});
  static const std::vector<std::string_view> kBeforeValueMarkers =
      with_stops({kValueOpen, kKeyOpen, kCallClose, kCallOpen});
  static const std::vector<std::string_view> kValueMarkers = with_stops({kValueClose, kCallClose});
  switch (state_) {
    case State::kReasoning: return kReasoningMarkers;
    case State::kContent: return kContentMarkers[options_.reasoning][options_.tools];
    case State::kCallName:
    case State::kCallArgs: return kNameMarkers;
    case State::kArgKey: return kKeyMarkers;
    case State::kBeforeValue: return kBeforeValueMarkers;
    case State::kArgValue: return kValueMarkers;
    case State::kDone: break;
  }
  return kNone;
}

OutputDelta OutputParser::Feed(std::string_view text) {
  OutputDelta out;
  if (state_ == State::kDone) return out;
  buffer_.append(text);
  Run(out, /*at_end=*/false);
  return out;
}

OutputDelta OutputParser::Finish() {
  OutputDelta out;
  if (state_ != State::kDone) {
    Run(out, /*at_end=*/true);
    CloseOpenCall(out);
    state_ = State::kDone;
  }
  if (!pending_space_.empty() && calls_.empty()) {
    content_ += pending_space_;
    out.content += pending_space_;
  }
  pending_space_.clear();
  buffer_.clear();
  return out;
}

void OutputParser::Run(OutputDelta& out, bool at_end) {
  size_t pos = 0;  // buffer_[0, pos) is consumed
  while (state_ != State::kDone) {
    std::string_view rest = std::string_view(buffer_).substr(pos);
    const std::vector<std::string_view>& markers = Markers();
    size_t found = std::string_view::npos;
    std::string_view marker;
    for (std::string_view m : markers) {
      size_t at = rest.find(m);
      if (at < found) {
        found = at;
        marker = m;
      }
    }
    if (found != std::string_view::npos) {
      EmitText(rest.substr(0, found), out);
      pos += found + marker.size();
      OnMarker(marker, out);
      if (marker == kCallOpen && state_ == State::kContent) {
        // Reasoning ended at <tool_call>, and content does not parse calls: the marker is text.
        EmitText(marker, out);
      }
      continue;
    }
    size_t keep = 0;
    if (!at_end) {
      // The longest suffix that could still become a marker of this state.
      size_t max_len = 0;
      for (std::string_view m : markers) max_len = std::max(max_len, m.size());
      size_t window = std::min(rest.size(), max_len == 0 ? 0 : max_len - 1);
      for (size_t p = rest.size() - window; p < rest.size(); ++p) {
        if (rest[p] != '<') continue;
        std::string_view tail = rest.substr(p);
        bool prefix = std::any_of(markers.begin(), markers.end(), [&](std::string_view m) {
          return m.size() > tail.size() && m.substr(0, tail.size()) == tail;
        });
        if (prefix) {
          keep = rest.size() - p;
          break;
        }
      }
      keep += IncompleteUtf8Tail(rest.substr(0, rest.size() - keep));
    }
    EmitText(rest.substr(0, rest.size() - keep), out);
    pos += rest.size() - keep;
    break;
  }
  if (state_ == State::kDone) {
    buffer_.clear();
  } else {
    buffer_.erase(0, pos);
  }
}

void OutputParser::OnMarker(std::string_view marker, OutputDelta& out) {
  if (IsStopMarker(marker)) {
    CloseOpenCall(out);
    state_ = State::kDone;
    stopped_by_marker_ = true;
    return;
  }
  auto start_call = [&] {
    pending_space_.clear();
    segment_started_ = false;
    state_ = State::kCallName;
    call_kept_ = options_.parallel_tool_calls || calls_.empty();
    call_named_ = false;
    call_num_args_ = 0;
    name_text_.clear();
  };
  switch (state_) {
    case State::kReasoning:
      if (marker == kThinkOpen) return;  // stray: swallowed
      reasoning_done_ = true;
      state_ = State::kContent;
      if (marker == kCallOpen && options_.tools) start_call();
      return;
    case State::kContent:
      if (marker == kThinkOpen) {
        bool at_start = options_.reasoning && !reasoning_done_ && calls_.empty() &&
                        content_.find_first_not_of(kSpace) == std::string::npos;
        if (at_start) {
          pending_space_.clear();
          state_ = State::kReasoning;
        }
        return;
      }
      if (marker == kThinkClose) return;  // stray: swallowed
      start_call();                       // kCallOpen
      return;
    case State::kCallName:
      EndName(out);
      if (marker == kKeyOpen) {
        state_ = State::kArgKey;
        key_text_.clear();
        return;
      }
      EndCall(out);
      if (marker == kCallOpen) start_call();
      return;
    case State::kCallArgs:
    case State::kBeforeValue:
      if (marker == kValueOpen) {
        StartValue(out);
        return;
      }
      if (marker == kKeyOpen) {  // a key without a value is dropped
        state_ = State::kArgKey;
        key_text_.clear();
        return;
      }
      EndCall(out);
      if (marker == kCallOpen) start_call();
      return;
    case State::kArgKey:
      if (marker == kKeyClose) {
        state_ = State::kBeforeValue;
        return;
      }
      EndCall(out);
      if (marker == kCallOpen) start_call();
      return;
    case State::kArgValue:
      EndValue(out);
      if (marker == kCallClose) EndCall(out);
      return;
    case State::kDone:
      return;
  }
}

void OutputParser::EmitText(std::string_view text, OutputDelta& out) {
  if (text.empty()) return;
  switch (state_) {
    case State::kReasoning:
      reasoning_.append(text);
      out.reasoning.append(text);
      return;
    case State::kContent:
      EmitContent(text, out);
      return;
    case State::kCallName:
      name_text_.append(text);
      return;
    case State::kArgKey:
      key_text_.append(text);
      return;
    case State::kArgValue:
      value_text_.append(text);
      if (value_is_string_ && call_named_) EmitArgs(EscapeJsonContent(text), out);
      return;
    case State::kCallArgs:
    case State::kBeforeValue:
    case State::kDone:
      return;  // between the parts of a call: ignored
  }
}

void OutputParser::EmitContent(std::string_view text, OutputDelta& out) {
  if (options_.tools && !segment_started_) {
    // A stretch of content between calls that is only whitespace is dropped: hold it until
    // other text shows it is more.
    size_t first = text.find_first_not_of(kSpace);
    if (first == std::string_view::npos) {
      pending_space_.append(text);
      return;
    }
    segment_started_ = true;
    content_ += pending_space_;
    out.content += pending_space_;
    pending_space_.clear();
  }
  content_.append(text);
  out.content.append(text);
}

void OutputParser::EmitArgs(std::string_view fragment, OutputDelta& out) {
  if (fragment.empty() || !call_named_) return;
  Call& call = calls_.back();
  call.arguments.append(fragment);
  int index = static_cast<int>(calls_.size()) - 1;
  if (!out.tool_calls.empty() && out.tool_calls.back().index == index &&
      !out.tool_calls.back().name.has_value()) {
    out.tool_calls.back().arguments_fragment.append(fragment);
    return;
  }
  out.tool_calls.push_back(ToolCallDelta{index, std::nullopt, std::nullopt, std::string(fragment)});
}

void OutputParser::EndName(OutputDelta& out) {
  std::string_view name = StripName(name_text_);
  if (!call_kept_ || name.empty()) {
    call_kept_ = false;
    return;
  }
  call_named_ = true;
  Call call{options_.new_tool_call_id(), std::string(name), ""};
  out.tool_calls.push_back(
      ToolCallDelta{static_cast<int>(calls_.size()), call.id, call.name, std::string()});
  calls_.push_back(std::move(call));
}

void OutputParser::StartValue(OutputDelta& out) {
  state_ = State::kArgValue;
  value_text_.clear();
  value_is_string_ = ValueIsString();
  std::string prefix = call_num_args_ == 0 ? "{" : ", ";
  prefix += QuoteJson(Strip(key_text_));
  prefix += ": ";
  if (value_is_string_) prefix += '"';
  ++call_num_args_;
  EmitArgs(prefix, out);
}

void OutputParser::EndValue(OutputDelta& out) {
  state_ = State::kCallArgs;
  if (value_is_string_) {
    EmitArgs("\"", out);
  } else {
    EmitArgs(PythonJsonDumps(DeserializeArgument(Strip(value_text_))), out);
  }
  value_text_.clear();
}

void OutputParser::EndCall(OutputDelta& out) {
  EmitArgs(call_num_args_ == 0 ? "{}" : "}", out);
  state_ = State::kContent;
  call_kept_ = false;
  call_named_ = false;
  call_num_args_ = 0;
  segment_started_ = false;
}

void OutputParser::CloseOpenCall(OutputDelta& out) {
  switch (state_) {
    case State::kCallName:  // the name never ended: nothing to emit
      state_ = State::kContent;
      call_kept_ = false;
      return;
    case State::kArgValue:
      EndValue(out);
      EndCall(out);
      return;
    case State::kCallArgs:
    case State::kArgKey:
    case State::kBeforeValue:
      EndCall(out);
      return;
    default:
      return;
  }
}

bool OutputParser::ValueIsString() const {
  if (!call_named_ || !options_.tools_schema.is_array()) return false;
  const std::string& name = calls_.back().name;
  std::string key(Strip(key_text_));
  for (const Json& tool : options_.tools_schema) {
    if (!tool.is_object()) continue;
    auto function = tool.find("function");
    if (function == tool.end() || !function->is_object()) continue;
    auto tool_name = function->find("name");
    if (tool_name == function->end() || *tool_name != name) continue;
    auto parameters = function->find("parameters");
    if (parameters == function->end() || !parameters->is_object()) return false;
    auto properties = parameters->find("properties");
    if (properties == parameters->end() || !properties->is_object()) return false;
    auto property = properties->find(key);
    return property != properties->end() && IsStringSchema(*property);
  }
  return false;
}

nlohmann::ordered_json OutputParser::tool_calls() const {
  Json calls = Json::array();
  for (const Call& call : calls_) {
    Json function = Json::object();
    function["name"] = call.name;
    function["arguments"] = call.arguments;
    Json item = Json::object();
    item["id"] = call.id;
    item["type"] = "function";
    item["function"] = std::move(function);
    calls.push_back(std::move(item));
  }
  return calls;
}

}  // namespace glm::openai
