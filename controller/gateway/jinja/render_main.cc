// glm-jinja-render TEMPLATE_FILE CONTEXT_JSON_FILE [--now=EPOCH_SECONDS]
// Prints the rendering of a chat template with a JSON context, as Template::Render returns it.
// On a parse or render error prints "error: <message>" to stderr and exits 1 (2 on bad usage).
// --now fixes strftime_now's clock, so the conformance test can compare against Python.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>

#include "controller/gateway/jinja/template.h"
#include "nlohmann/json.hpp"

namespace {
bool ReadFile(const char* path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return true;
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: %s TEMPLATE_FILE CONTEXT_JSON_FILE [--now=EPOCH_SECONDS]\n", argv[0]);
    return 2;
  }
  glm::jinja::RenderOptions options;
  if (argc == 4) {
    std::string arg = argv[3];
    if (arg.rfind("--now=", 0) != 0) {
      std::fprintf(stderr, "unknown argument %s\n", argv[3]);
      return 2;
    }
    std::time_t now = static_cast<std::time_t>(std::strtoll(arg.c_str() + 6, nullptr, 10));
    options.now = [now] { return now; };
  }
  std::string source;
  std::string context_text;
  if (!ReadFile(argv[1], &source) || !ReadFile(argv[2], &context_text)) {
    std::fprintf(stderr, "error: cannot read %s or %s\n", argv[1], argv[2]);
    return 2;
  }
  nlohmann::ordered_json context = nlohmann::ordered_json::parse(context_text, nullptr, false);
  if (context.is_discarded()) {
    std::fprintf(stderr, "error: %s is not valid JSON\n", argv[2]);
    return 2;
  }
  auto tmpl = glm::jinja::Template::Parse(source);
  if (!tmpl.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(tmpl.status().message()).c_str());
    return 1;
  }
  auto rendered = tmpl->Render(context, options);
  if (!rendered.ok()) {
    std::fprintf(stderr, "error: %s\n", std::string(rendered.status().message()).c_str());
    return 1;
  }
  std::fwrite(rendered->data(), 1, rendered->size(), stdout);
  return 0;
}
