// Python str semantics on UTF-8 text: case mapping, strip, split, title. Case mapping covers
// ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (what chat templates meet); other
// scripts are left unchanged, where Python would map them too.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace glm::jinja {

std::string PyUpper(std::string_view s);
std::string PyLower(std::string_view s);
std::string PyTitle(std::string_view s);       // str.title()
std::string JinjaTitle(std::string_view s);    // the `title` filter (splits at [-\s({\[<]+)
std::string PyCapitalize(std::string_view s);  // str.capitalize()
bool PyIsUpper(std::string_view s);
bool PyIsLower(std::string_view s);
bool PyIsDigit(std::string_view s);
bool PyIsAlpha(std::string_view s);
bool PyIsSpace(std::string_view s);

enum class StripSide { kBoth, kLeft, kRight };
// chars unset: whitespace (str.isspace); else the set of code points in *chars.
std::string_view PyStrip(std::string_view s, const std::optional<std::string>& chars, StripSide side);
// str.split / str.rsplit; sep unset splits on whitespace runs. maxsplit < 0: no limit.
std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit, bool from_right);
std::vector<std::string> PySplitLines(std::string_view s, bool keepends);
std::string PyReplace(std::string_view s, std::string_view old, std::string_view repl, int64_t count);
// str.find on code points; -1 if absent.
int64_t PyFind(std::string_view s, std::string_view sub, bool from_right);
int64_t PyCount(std::string_view s, std::string_view sub);

}  // namespace glm::jinja
