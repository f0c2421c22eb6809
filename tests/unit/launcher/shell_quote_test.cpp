#include "launcher/shell_quote.h"

#include <gtest/gtest.h>

namespace dstrain::launcher {
namespace {

TEST(ShellQuote, SafeWordsStayBare) {
  EXPECT_EQ(shell_quote("train"), "train");
  EXPECT_EQ(shell_quote("/usr/bin/dstrain"), "/usr/bin/dstrain");
  EXPECT_EQ(shell_quote("training.lr=1e-4"), "training.lr=1e-4");
}

TEST(ShellQuote, SpecialCharactersAreSingleQuoted) {
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(shell_quote("a b"), "'a b'");
  EXPECT_EQ(shell_quote("$HOME"), "'$HOME'");
  EXPECT_EQ(shell_quote("x;rm -rf /"), "'x;rm -rf /'");
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote("a\nb"), "'a\nb'");
}

TEST(ShellQuote, JoinQuotesEachWord) {
  EXPECT_EQ(shell_join({"sh", "-c", "echo $RANK"}), "sh -c 'echo $RANK'");
  EXPECT_EQ(shell_join({}), "");
}

}  // namespace
}  // namespace dstrain::launcher
