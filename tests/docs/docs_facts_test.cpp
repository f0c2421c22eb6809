// Facts of the source tree that README.md and docs/ state: the DSTRAIN_* variables the code reads,
// the modules under lib/, the GPU tests. A variable, module or GPU test added, renamed or removed
// on one side only fails here, naming it.

#include <cctype>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/docs/docs_text.h"

namespace dstrain::testing {
namespace {

namespace stdfs = std::filesystem;

std::string join(const std::set<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// Every "DSTRAIN_..." string literal in the C++ and CUDA sources under `dirs`: the names of the
// environment variables the code reads or sets (macros are not string literals).
std::set<std::string> variables_in_code(const std::vector<std::string>& dirs) {
  static const std::regex literal("\"(DSTRAIN_[A-Z0-9_]*[A-Z0-9])");
  std::set<std::string> names;
  for (const std::string& dir : dirs) {
    for (const auto& entry : stdfs::recursive_directory_iterator(DSTRAIN_SOURCE_DIR "/" + dir)) {
      const std::string ext = entry.path().extension().string();
      if (ext != ".cpp" && ext != ".h" && ext != ".cu") continue;
      const std::string text = source_file(stdfs::relative(entry.path(), DSTRAIN_SOURCE_DIR));
      for (std::sregex_iterator it(text.begin(), text.end(), literal), e; it != e; ++it) {
        names.insert((*it)[1]);
      }
    }
  }
  return names;
}

TEST(DocsFacts, TheEnvironmentTableIsEveryDstrainVariableTheCodeReads) {
  const std::set<std::string> in_code = variables_in_code({"lib", "launcher", "apps"});
  ASSERT_GE(in_code.size(), 5u) << "the source scan found too few variables: " << join(in_code);
  const std::string table =
      section(source_file("docs/config.md"), "## Environment variables", "docs/config.md");
  std::set<std::string> documented;
  for (const auto& row : table_rows(table)) {
    for (const std::string& name : code_spans(row.at(0))) documented.insert(name);
  }
  for (const std::string& name : in_code) {
    EXPECT_EQ(documented.count(name), 1u)
        << name << " is read by the code but not in docs/config.md's \"Environment variables\"";
  }
  for (const std::string& name : documented) {
    EXPECT_EQ(in_code.count(name), 1u)
        << name << " is in docs/config.md's \"Environment variables\" but no code reads it";
  }
}

std::set<std::string> lib_modules() {
  std::set<std::string> modules;
  for (const auto& entry : stdfs::directory_iterator(DSTRAIN_SOURCE_DIR "/lib")) {
    if (entry.is_directory() && stdfs::exists(entry.path() / "CMakeLists.txt")) {
      modules.insert(entry.path().filename().string());
    }
  }
  return modules;
}

// "core, config, kernels, ..." (line breaks and all) -> {core, config, kernels, ...}.
std::set<std::string> comma_list(const std::string& text) {
  std::set<std::string> items;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::stringstream words(item);
    std::string word;
    if (words >> word) items.insert(word);
  }
  return items;
}

TEST(DocsFacts, ReadmeAndArchitectureNameEveryLibModule) {
  const std::set<std::string> modules = lib_modules();
  ASSERT_GE(modules.size(), 10u) << join(modules);
  const std::string readme_list = between(source_file("README.md"), "`lib/<module>` (", ")");
  ASSERT_FALSE(readme_list.empty()) << "README.md has no \"`lib/<module>` (...)\" list";
  EXPECT_EQ(comma_list(readme_list), modules)
      << "README.md lists " << join(comma_list(readme_list)) << "; lib/ holds " << join(modules);

  const std::string layers = section(source_file("docs/architecture.md"),
                                     "## Modules and their direction", "docs/architecture.md");
  std::set<std::string> in_table;
  for (const auto& row : table_rows(layers)) {
    if (row.size() < 2) continue;
    // The modules cell names each module first, or after ", " or "; ": "`config` — typed
    // sections, ...; `kernels` — the CUDA kernels ...", "`comm`, `tokenizer`, ...".
    static const std::regex name("(^|; |, )`([a-z]+)`");
    for (std::sregex_iterator it(row[1].begin(), row[1].end(), name), e; it != e; ++it) {
      in_table.insert((*it)[2]);
    }
  }
  in_table.erase("launcher");  // a layer of its own, outside lib/
  EXPECT_EQ(in_table, modules) << "docs/architecture.md's layers name " << join(in_table)
                               << "; lib/ holds " << join(modules);
}

// Each module's DEPS in its CMakeLists.txt: the words after DEPS up to the next keyword (LIBS,
// TORCH, PCH, SOURCES) or the closing parenthesis, over every dstrain_module() call of the file.
std::set<std::string> cmake_deps(const std::string& cmake_file) {
  const std::string text = source_file(cmake_file);
  static const std::regex deps("DEPS([^)]*)");
  static const std::set<std::string> keywords = {"LIBS", "TORCH", "PCH", "SOURCES"};
  std::set<std::string> out;
  for (std::sregex_iterator it(text.begin(), text.end(), deps), e; it != e; ++it) {
    std::stringstream words((*it)[1].str());
    std::string word;
    while (words >> word && keywords.count(word) == 0) out.insert(word);
  }
  return out;
}

TEST(DocsFacts, ArchitectureListsEachModulesCmakeDependencies) {
  const std::string text = section(source_file("docs/architecture.md"),
                                   "## Modules and their direction", "docs/architecture.md");
  std::map<std::string, std::set<std::string>> documented;
  static const std::regex name("`([a-z]+)`");
  for (const auto& row : table_rows(text)) {
    if (row.size() != 2 || row[0].rfind("`", 0) != 0) continue;  // the "depends on" table only
    std::smatch module;
    if (!std::regex_match(row[0], module, std::regex("`([a-z]+)`"))) continue;
    std::set<std::string>& deps = documented[module[1]];
    for (std::sregex_iterator it(row[1].begin(), row[1].end(), name), e; it != e; ++it) {
      deps.insert((*it)[1]);
    }
  }
  std::set<std::string> modules = lib_modules();
  modules.insert("launcher");  // outside lib/
  for (const std::string& m : modules) {
    const std::string file =
        m == "launcher" ? "launcher/CMakeLists.txt" : "lib/" + m + "/CMakeLists.txt";
    ASSERT_EQ(documented.count(m), 1u)
        << "docs/architecture.md has no \"depends on\" row for " << m;
    EXPECT_EQ(documented.at(m), cmake_deps(file))
        << m << ": docs/architecture.md says " << join(documented.at(m)) << "; " << file
        << " declares " << join(cmake_deps(file));
  }
  EXPECT_EQ(documented.size(), modules.size()) << "rows for modules that do not exist";
}

// The tests tests/gpu/CMakeLists.txt registers with the label gpu.
std::set<std::string> gpu_tests() {
  const std::string cmake = source_file("tests/gpu/CMakeLists.txt");
  static const std::regex test("dstrain_test\\((\\w+)([^)]*)\\)");
  std::set<std::string> names;
  for (std::sregex_iterator it(cmake.begin(), cmake.end(), test), e; it != e; ++it) {
    if (std::string((*it)[2]).find("LABELS gpu") != std::string::npos) names.insert((*it)[1]);
  }
  return names;
}

TEST(DocsFacts, GpuPageListsEveryGpuTest) {
  const std::set<std::string> tests = gpu_tests();
  ASSERT_GE(tests.size(), 3u) << join(tests);
  const std::string gpu = source_file("docs/gpu.md");
  std::set<std::string> labelled_gpu;
  for (const auto& row : table_rows(section(gpu, "## Tests", "docs/gpu.md"))) {
    const std::vector<std::string> name = code_spans(row.at(0));
    if (row.size() > 1 && row[1] == "gpu" && name.size() == 1) labelled_gpu.insert(name[0]);
  }
  EXPECT_EQ(labelled_gpu, tests) << "docs/gpu.md's test table labels " << join(labelled_gpu)
                                 << " gpu; tests/gpu/CMakeLists.txt registers " << join(tests);
  // The bundle's gpu-tests step runs every GPU test program.
  std::string step;
  const std::string bundle =
      section(source_file("CONTRIBUTING.md"), "## On a GPU machine: the bundle", "CONTRIBUTING.md");
  for (const auto& row : table_rows(bundle)) {
    if (!row.empty() && row[0] == "2 gpu-tests" && row.size() >= 3) step = row[2];
  }
  ASSERT_FALSE(step.empty()) << "CONTRIBUTING.md has no '2 gpu-tests' row in the bundle's steps";
  for (const std::string& test : tests) {
    EXPECT_NE(step.find("`" + test + "`"), std::string::npos)
        << test << " is missing from the bundle's gpu-tests step in CONTRIBUTING.md";
  }
}

// GitHub's anchor of a heading's text: lower case; letters, digits, '-' and '_' kept, spaces made
// '-', everything else dropped (the non-ASCII characters of these headings are symbols: ×, →, –).
std::string anchor_of(const std::string& heading) {
  std::string anchor;
  for (const char c : heading) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x80) continue;
    if (std::isalnum(u) || c == '-' || c == '_') {
      anchor += static_cast<char>(std::tolower(u));
    } else if (c == ' ') {
      anchor += '-';
    }
  }
  return anchor;
}

// The anchors of a page's headings (outside code blocks); a repeated one gets -1, -2, ...
std::set<std::string> anchors(const std::string& page) {
  std::set<std::string> out;
  std::map<std::string, int> seen;
  std::istringstream in(page);
  std::string line;
  bool in_code = false;
  while (std::getline(in, line)) {
    if (line.rfind("```", 0) == 0) in_code = !in_code;
    const size_t hashes = line.find_first_not_of('#');
    if (in_code || hashes == 0 || hashes == std::string::npos || line[hashes] != ' ') continue;
    const std::string anchor = anchor_of(line.substr(hashes + 1));
    const int n = seen[anchor]++;
    out.insert(n == 0 ? anchor : anchor + "-" + std::to_string(n));
  }
  return out;
}

TEST(DocsFacts, EveryLinkBetweenPagesPointsAtAPageAndAHeading) {
  std::vector<std::string> pages = {"README.md"};
  for (const auto& entry : stdfs::directory_iterator(DSTRAIN_SOURCE_DIR "/docs")) {
    if (entry.path().extension() == ".md")
      pages.push_back("docs/" + entry.path().filename().string());
  }
  static const std::regex link("\\]\\(([^()#\\s:]*\\.md)?(#[^()\\s]+)?\\)");
  size_t checked = 0;
  for (const std::string& page : pages) {
    const std::string text = source_file(page);
    const stdfs::path dir = stdfs::path(page).parent_path();
    for (std::sregex_iterator it(text.begin(), text.end(), link), e; it != e; ++it) {
      const std::string target =
          (*it)[1].matched ? (dir / (*it)[1].str()).lexically_normal().string() : page;
      if (!(*it)[1].matched && !(*it)[2].matched) continue;
      ++checked;
      const std::string where = page + ": link " + (*it)[0].str();
      ASSERT_TRUE(stdfs::exists(stdfs::path(DSTRAIN_SOURCE_DIR) / target))
          << where << ": no " << target;
      if (!(*it)[2].matched) continue;
      const std::string anchor = (*it)[2].str().substr(1);
      EXPECT_EQ(anchors(source_file(target)).count(anchor), 1u)
          << where << ": " << target << " has no heading with the anchor #" << anchor;
    }
  }
  EXPECT_GT(checked, 50u) << "too few links found";
  // The check can fail: a heading's anchor is what GitHub makes of it.
  EXPECT_EQ(anchor_of("Resuming: `dstrain resume`"), "resuming-dstrain-resume");
  EXPECT_EQ(anchors("# A\n```\n# not a heading\n```\n## A\n").count("a-1"), 1u);
}

// README.md and every docs/*.md by name.
std::vector<std::string> user_pages() {
  std::vector<std::string> pages = {"README.md"};
  for (const auto& entry : stdfs::directory_iterator(DSTRAIN_SOURCE_DIR "/docs")) {
    if (entry.path().extension() == ".md")
      pages.push_back("docs/" + entry.path().filename().string());
  }
  return pages;
}

// What the user pages may not say of commits and of how the project came to be, outside code
// blocks: a commit hash (7 to 40 hex digits, letters and digits both) other than a figure's
// citation, that is other than in a URL or with "commit", "build" or a date (2026-11-23) in its
// line before it or in the 6 lines above; and phrases of development history.
std::vector<std::string> history_findings(const std::string& page, const std::string& text) {
  static const std::regex hash("\\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\\b");
  static const std::regex cited("commit|build|20[0-9]{2}-[0-9]{2}-[0-9]{2}", std::regex::icase);
  static const std::regex url("https?://\\S*$");
  static const std::regex history(
      "as it was in (these|those|the) commits?|before [a-z`_ ]{0,40} (was|were) recorded|"
      "the default before|pre-unity|this session|a previous session|in an earlier (build|version)",
      std::regex::icase);
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::vector<std::string> out;
  bool fenced = false;
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    if (line.rfind("```", 0) == 0) fenced = !fenced;
    if (fenced || line.rfind("```", 0) == 0) continue;
    const std::string where = page + ":" + std::to_string(i + 1) + ": ";
    std::smatch m;
    if (std::regex_search(line, m, history)) out.push_back(where + "history: " + m.str());
    for (std::sregex_iterator it(line.begin(), line.end(), hash), e; it != e; ++it) {
      const std::string before = line.substr(0, static_cast<size_t>(it->position()));
      if (std::regex_search(before, url)) continue;
      std::string window = before;
      for (size_t k = i >= 6 ? i - 6 : 0; k < i; ++k) window += "\n" + lines[k];
      if (!std::regex_search(window, cited)) out.push_back(where + "commit " + it->str());
    }
  }
  return out;
}

TEST(DocsFacts, CommitsAppearOnlyAsAFiguresCitationAndNoDevelopmentHistory) {
  std::vector<std::string> findings;
  for (const std::string& page : user_pages()) {
    for (std::string& f : history_findings(page, source_file(page))) findings.push_back(f);
  }
  std::string said;
  for (const std::string& f : findings) said += f + "\n";
  EXPECT_TRUE(findings.empty()) << said;
  // The check can fail.
  EXPECT_EQ(history_findings("p", "Measured 5 tokens/s.\nThe fix landed in 1a2b3c4.\n").size(), 1u);
  EXPECT_EQ(history_findings("p", "2026-11-23, recorded in commit 1a2b3c4.\n").size(), 0u);
  EXPECT_EQ(history_findings("p", "[x](https://github.com/a/b/blob/1a2b3c4d/f.cc)\n").size(), 0u);
  EXPECT_EQ(history_findings("p", "```\n1a2b3c4\n```\n").size(), 0u);
  EXPECT_EQ(history_findings("p", "The default before documents existed.\n").size(), 1u);
  EXPECT_EQ(history_findings("p", "a decade of added faces\n").size(), 0u);
}

}  // namespace
}  // namespace dstrain::testing
