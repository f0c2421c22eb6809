// The CLI against its documentation. Commands and flags are read from the built binary's own
// --help (every listed command and subcommand), so a command or flag added, renamed or removed
// without its example and its documentation fails here, naming it. Also: which executable runs
// which command (docs/launch.md), and the GPU quick start's config and hostfile (they plan).

#include <dirent.h>

#include <cctype>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/integration/process_util.h"
#include "tests/integration/train_util.h"

namespace dstrain::testing {
namespace {

// The names under "Subcommands:" in a CLI11 help text.
std::vector<std::string> listed_subcommands(const std::string& help) {
  std::vector<std::string> names;
  const size_t start = help.find("\nSubcommands:\n");
  if (start == std::string::npos) return names;
  size_t pos = start + std::string("\nSubcommands:\n").size();
  while (pos < help.size() && help.compare(pos, 2, "  ") == 0) {
    const size_t end = help.find('\n', pos);
    const std::string line = help.substr(pos, end - pos);
    names.push_back(line.substr(2, line.find(' ', 2) - 2));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return names;
}

std::string help_of(const std::string& command) {
  std::vector<std::string> args;
  std::string word;
  for (char c : command + " ") {
    if (c != ' ') {
      word += c;
    } else if (!word.empty()) {
      args.push_back(word);
      word.clear();
    }
  }
  args.push_back("--help");
  const RunResult r = run_dstrain(args, {}, 30);
  EXPECT_EQ(r.exit_code, 0) << "dstrain " << command << " --help\n" << r.err;
  return r.out;
}

struct Commands {
  std::vector<std::string> all;     // "launch", "data", "data tokenize", ...
  std::vector<std::string> leaves;  // those without subcommands: what users run
};

// Every command `dstrain --help` lists, and their subcommands, as the binary itself lists them.
Commands cli_commands() {
  Commands c;
  for (const std::string& name : listed_subcommands(help_of(""))) {
    c.all.push_back(name);
    const std::vector<std::string> subs = listed_subcommands(help_of(name));
    if (subs.empty()) c.leaves.push_back(name);
    for (const std::string& sub : subs) {
      c.all.push_back(name + " " + sub);
      c.leaves.push_back(name + " " + sub);
    }
  }
  return c;
}

// A help text's worked example: "Example:" or "Examples:" (optionally with a note in parentheses),
// then a line running `dstrain <command>`.
bool shows_example_of(const std::string& help, const std::string& command) {
  const std::string prefix = command.empty() ? "dstrain" : "dstrain " + command;
  const std::regex example("(^|\\n)Examples?( \\([^\\n]*\\))?:\\n(  [^\\n]*\\n)*?  " + prefix +
                           "( |\\n|$)");
  return std::regex_search(help, example);
}

std::string docs_text() {
  std::string all = read_text(DSTRAIN_SOURCE_DIR "/README.md");
  const std::string dir = DSTRAIN_SOURCE_DIR "/docs";
  DIR* d = ::opendir(dir.c_str());
  EXPECT_NE(d, nullptr) << dir;
  if (d == nullptr) return all;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > 3 && name.compare(name.size() - 3, 3, ".md") == 0) {
      all += read_text(dir + "/" + name);
    }
  }
  ::closedir(d);
  return all;
}

// The backticked items of docs/status.md's "- CLI:" entry, up to the next entry.
std::set<std::string> status_cli_list() {
  const std::string status = read_text(DSTRAIN_SOURCE_DIR "/docs/status.md");
  const size_t start = status.find("\n- CLI:");
  EXPECT_NE(start, std::string::npos) << "docs/status.md has no '- CLI:' entry";
  if (start == std::string::npos) return {};
  const size_t end = status.find("\n- ", start + 1);
  const std::string entry = status.substr(start, end - start);
  // The list ends at the first sentence: "`launch`, `train`, ..., `version`."
  const size_t list_end = entry.find("`.");
  const std::string list = entry.substr(0, list_end == std::string::npos ? list_end : list_end + 1);
  std::set<std::string> items;
  static const std::regex item("`([^`]+)`");
  for (std::sregex_iterator it(list.begin(), list.end(), item), e; it != e; ++it) {
    const std::string text = (*it)[1];
    items.insert(text);
  }
  return items;
}

TEST(CliDocs, EveryCommandsHelpShowsAWorkedExample) {
  EXPECT_TRUE(shows_example_of(help_of(""), "")) << help_of("");
  const Commands c = cli_commands();
  ASSERT_GT(c.leaves.size(), 10u) << "too few commands listed by dstrain --help";
  for (const std::string& command : c.all) {
    const std::string help = help_of(command);
    EXPECT_TRUE(shows_example_of(help, command))
        << "'dstrain " << command << " --help' shows no 'Example:' running it:\n"
        << help;
  }
  // The check can fail: a help text without an example of that command is caught.
  EXPECT_FALSE(shows_example_of("Usage: dstrain version\n", "version"));
  EXPECT_FALSE(shows_example_of("Example:\n  dstrain train run.yaml\n", "resume"));
}

TEST(CliDocs, EveryCommandIsDocumentedAndListedInStatus) {
  const Commands c = cli_commands();
  const std::string docs = docs_text();
  const std::set<std::string> listed = status_cli_list();
  for (const std::string& command : c.leaves) {
    EXPECT_NE(docs.find("dstrain " + command), std::string::npos)
        << "'dstrain " << command << "' appears nowhere in README.md or docs/";
    EXPECT_EQ(listed.count(command), 1u)
        << "'" << command << "' is missing from docs/status.md's CLI entry";
  }
  const std::set<std::string> leaves(c.leaves.begin(), c.leaves.end());
  for (const std::string& item : listed) {
    EXPECT_EQ(leaves.count(item), 1u)
        << "docs/status.md lists '" << item << "', which dstrain --help does not";
  }
}

// The long flags a CLI11 help text lists ("  --nproc,--nproc-per-node,--nproc_per_node N [1] ..."),
// every spelling, without --help and --help-all.
std::vector<std::string> listed_flags(const std::string& help) {
  std::vector<std::string> flags;
  static const std::regex option_line("^  ((-{1,2}[A-Za-z0-9_-]+,?)+)");
  std::istringstream in(help);
  std::string line;
  while (std::getline(in, line)) {
    std::smatch m;
    if (!std::regex_search(line, m, option_line)) continue;
    std::stringstream names(m[1].str());
    std::string name;
    while (std::getline(names, name, ',')) {
      if (name.rfind("--", 0) == 0 && name != "--help" && name != "--help-all") {
        flags.push_back(name);
      }
    }
  }
  return flags;
}

// True when `docs` has `flag` as a whole word (not as the start of a longer flag).
bool mentions_flag(const std::string& docs, const std::string& flag) {
  for (size_t at = docs.find(flag); at != std::string::npos; at = docs.find(flag, at + 1)) {
    const size_t next = at + flag.size();
    if (next == docs.size()) return true;
    const char c = docs[next];
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-') return true;
  }
  return false;
}

TEST(CliDocs, EveryFlagOfEveryCommandIsDocumented) {
  const std::string docs = docs_text();
  std::vector<std::string> commands = cli_commands().all;
  commands.insert(commands.begin(), "");
  size_t checked = 0;
  for (const std::string& command : commands) {
    for (const std::string& flag : listed_flags(help_of(command))) {
      ++checked;
      EXPECT_TRUE(mentions_flag(docs, flag))
          << "'dstrain " << command << "' takes " << flag << ", which README.md and docs/ never "
          << "mention";
    }
  }
  EXPECT_GT(checked, 40u) << "too few flags found in the help texts";
  // The check can fail: a longer flag does not document its prefix.
  EXPECT_FALSE(mentions_flag("`--nproc-per-node`", "--nproc"));
  EXPECT_TRUE(mentions_flag("`--nproc` N", "--nproc"));
}

// The commands a row of docs/launch.md's "Two executables" table says its executable runs.
std::set<std::string> commands_run_by(const std::string& executable) {
  const std::string launch = read_text(DSTRAIN_SOURCE_DIR "/docs/launch.md");
  const size_t start = launch.find("## Two executables");
  EXPECT_NE(start, std::string::npos) << "docs/launch.md has no '## Two executables' section";
  std::istringstream in(launch.substr(start == std::string::npos ? 0 : start));
  std::string line;
  std::set<std::string> commands;
  while (std::getline(in, line)) {
    const std::string row = "| `" + executable + "` |";
    if (line.rfind(row, 0) != 0) continue;
    const std::string runs = line.substr(row.size(), line.find('|', row.size()) - row.size());
    static const std::regex item("`([a-z][a-z-]*)`");
    for (std::sregex_iterator it(runs.begin(), runs.end(), item), e; it != e; ++it) {
      commands.insert((*it)[1]);
    }
  }
  return commands;
}

std::string join(const std::set<std::string>& items) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

TEST(CliDocs, TheTwoExecutablesTableSaysWhichRunsEachCommand) {
  std::set<std::string> front, worker;
  for (const std::string& command : listed_subcommands(help_of(""))) {
    // The dynamic loader names every library it loads: a command that loads LibTorch runs in
    // dstrain-worker.
    const RunResult r = run_dstrain({command, "--help"}, {"LD_DEBUG=files"}, 30);
    ASSERT_EQ(r.exit_code, 0) << command << "\n" << r.err.substr(0, 2000);
    (r.err.find("libtorch") != std::string::npos ? worker : front).insert(command);
  }
  ASSERT_FALSE(front.empty());
  ASSERT_FALSE(worker.empty());
  EXPECT_EQ(commands_run_by("dstrain"), front)
      << "docs/launch.md says dstrain runs " << join(commands_run_by("dstrain"))
      << "; without LibTorch it runs " << join(front);
  EXPECT_EQ(commands_run_by("dstrain-worker"), worker)
      << "docs/launch.md says dstrain-worker runs " << join(commands_run_by("dstrain-worker"))
      << "; the commands that load LibTorch are " << join(worker);
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

// The GPU quick start's config and hostfile, as the page has them, plan 16 ranks on 2 hosts of 8
// (the launcher validates the config at that world size and connects to nothing).
TEST(CliDocs, GpuQuickStartPlansSixteenRanksOnTwoHostsOfEight) {
  TempDir dir;
  const std::string config = quick_start_block("qwen-lora.yaml"),
                    hosts = quick_start_block("hosts");
  ASSERT_NE(config, "") << "docs/quickstart-gpu.md has no qwen-lora.yaml block";
  ASSERT_NE(hosts, "") << "docs/quickstart-gpu.md has no hosts block";
  write_file(dir.file("qwen-lora.yaml"), config);
  write_file(dir.file("hosts"), hosts);
  const RunResult r = run_dstrain(
      {"launch", "--hostfile", dir.file("hosts"), "--dry-run", dir.file("qwen-lora.yaml")}, {}, 30);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("WORLD_SIZE=16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("RANK=15 "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("LOCAL_WORLD_SIZE=8"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MASTER_ADDR=node1 MASTER_PORT=29500"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace dstrain::testing
