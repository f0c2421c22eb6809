#include "tests/docs/docs_text.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>

namespace dstrain::testing {
namespace {

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

// "## Exit codes" -> 2; 0 for a line that is not a heading.
size_t heading_level(const std::string& line) {
  const size_t hashes = line.find_first_not_of('#');
  return hashes != std::string::npos && hashes > 0 && line[hashes] == ' ' ? hashes : 0;
}

}  // namespace

std::string source_file(const std::string& relative) {
  const std::string path = std::string(DSTRAIN_SOURCE_DIR) + "/" + relative;
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot read " << path;
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

std::string all_docs() {
  std::vector<std::string> pages;
  for (const auto& entry : std::filesystem::directory_iterator(DSTRAIN_SOURCE_DIR "/docs")) {
    if (entry.path().extension() == ".md")
      pages.push_back("docs/" + entry.path().filename().string());
  }
  std::sort(pages.begin(), pages.end());
  std::string all = source_file("README.md");
  for (const std::string& page : pages) all += "\n" + source_file(page);
  return all;
}

std::string section(const std::string& text, const std::string& heading, const std::string& where) {
  std::istringstream in(text);
  std::string line;
  std::string out;
  size_t level = 0;
  while (std::getline(in, line)) {
    const size_t this_level = heading_level(line);
    if (level == 0) {
      if (line == heading) level = this_level;
      continue;
    }
    if (this_level > 0 && this_level <= level) break;
    out += line + "\n";
  }
  EXPECT_NE(level, 0u) << where << " has no heading '" << heading << "'";
  return out;
}

std::vector<std::vector<std::string>> table_rows(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(text);
  std::string line;
  bool header = true;
  while (std::getline(in, line)) {
    if (line.rfind("|", 0) != 0) {
      header = true;  // the next table starts with its header row
      continue;
    }
    if (line.find_first_not_of("|-: ") == std::string::npos) continue;  // the separator row
    if (header) {
      header = false;
      continue;
    }
    std::vector<std::string> cells;
    std::string cell;
    for (size_t i = 1; i < line.size(); ++i) {
      if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '|') {
        cell += '|';
        ++i;
      } else if (line[i] == '|') {
        cells.push_back(trim(cell));
        cell.clear();
      } else {
        cell += line[i];
      }
    }
    rows.push_back(cells);
  }
  return rows;
}

std::vector<std::string> code_spans(const std::string& text) {
  std::vector<std::string> out;
  static const std::regex span("`([^`]*)`");
  for (std::sregex_iterator it(text.begin(), text.end(), span), end; it != end; ++it) {
    out.push_back((*it)[1]);
  }
  return out;
}

std::string between(const std::string& text, const std::string& start, const std::string& end) {
  const size_t b = text.find(start);
  if (b == std::string::npos) return "";
  const size_t e = text.find(end, b + start.size());
  if (e == std::string::npos) return "";
  return text.substr(b + start.size(), e - b - start.size());
}

}  // namespace dstrain::testing
