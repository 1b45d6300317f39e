#include "engine/runtime/stop_matcher.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace strata::runtime {
namespace {

// Feeds `pieces` and returns everything emitted, including Flush when no stop matched.
struct Streamed {
  std::string text;
  bool stopped = false;
  std::vector<std::string> emits;
};

Streamed Feed(StopMatcher& m, const std::vector<std::string>& pieces) {
  Streamed run;
  for (const std::string& piece : pieces) {
    StopResult r = m.Push(piece);
    run.emits.push_back(r.emit);
    run.text += r.emit;
    if (r.stopped) {
      run.stopped = true;
      break;
    }
  }
  if (!run.stopped) run.text += m.Flush();
  return run;
}

// What the stream should produce, computed directly: the first position where some stop string ends
// (the longest one on a tie) cuts the text at that string's start.
Streamed Reference(const std::string& text, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    const std::string* best = nullptr;
    for (const std::string& s : stops) {
      if (s.empty() || s.size() > end) continue;
      if (text.compare(end - s.size(), s.size(), s) == 0 && (best == nullptr || s.size() > best->size())) {
        best = &s;
      }
    }
    if (best != nullptr) return {text.substr(0, end - best->size()), true, {}};
  }
  return {text, false, {}};
}

TEST(StopMatcher, StopSplitAcrossThreePiecesIsNotEmitted) {
  StopMatcher m({"<|end|>"});
  const Streamed run = Feed(m, {"Hello wor", "ld<|e", "nd", "|>more text"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.text, "Hello world");
  EXPECT_EQ(run.emits[0], "Hello wor");  // nothing there could start the stop string
  EXPECT_EQ(run.emits[1], "ld");         // "<|e" is held
  EXPECT_EQ(run.emits[2], "");           // "<|end" is held
  EXPECT_EQ(run.emits[3], "");
  EXPECT_EQ(m.matched(), "<|end|>");
  EXPECT_TRUE(m.stopped());
}

TEST(StopMatcher, HeldPrefixIsReleasedWhenItDiverges) {
  StopMatcher m({"STOP"});
  StopResult r = m.Push("ab ST");
  EXPECT_EQ(r.emit, "ab ");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(m.held_bytes(), 2u);
  r = m.Push("O");
  EXPECT_EQ(r.emit, "");
  r = m.Push("RM now");
  EXPECT_EQ(r.emit, "STORM now");
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(m.held_bytes(), 0u);
}

TEST(StopMatcher, DivergingPrefixMayStartAnotherMatch) {
  // "SSTOP": the first S is released, the second starts the match.
  StopMatcher m({"STOP"});
  const Streamed run = Feed(m, {"xS", "S", "TO", "P!"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.text, "xS");
}

TEST(StopMatcher, FlushReleasesHeldText) {
  StopMatcher m({"\n\nUser:"});
  StopResult r = m.Push("answer\n\nUs");
  EXPECT_EQ(r.emit, "answer");
  EXPECT_EQ(m.Flush(), "\n\nUs");
  EXPECT_EQ(m.held_bytes(), 0u);
}

TEST(StopMatcher, EarliestMatchWins) {
  StopMatcher m({"world", "lo"});
  const Streamed run = Feed(m, {"hello world"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.text, "hel");
  EXPECT_EQ(m.matched(), "lo");

  // Within one piece the string that completes first wins, even if another started earlier.
  StopMatcher n({"abcd", "bc"});
  EXPECT_EQ(Feed(n, {"xabcd"}).text, "xa");
  EXPECT_EQ(n.matched(), "bc");

  // Two strings ending at the same byte: the longer one, which starts earlier, is cut.
  StopMatcher o({"cd", "bcd"});
  EXPECT_EQ(Feed(o, {"ab", "cde"}).text, "a");
  EXPECT_EQ(o.matched(), "bcd");
}

TEST(StopMatcher, StopAtTheVeryStart) {
  StopMatcher m({"###"});
  const Streamed run = Feed(m, {"##", "#tail"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.text, "");
  StopMatcher n({"###"});
  StopResult r = n.Push("###");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "");
}

TEST(StopMatcher, NothingAfterStop) {
  StopMatcher m({"x"});
  EXPECT_TRUE(m.Push("abxcd").stopped);
  StopResult r = m.Push("more");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.emit, "");
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcher, NoStopStringsPassesEverything) {
  StopMatcher m({});
  EXPECT_EQ(m.Push("abc").emit, "abc");
  StopMatcher empty_only({""});  // empty strings are ignored rather than matching everywhere
  EXPECT_EQ(empty_only.Push("abc").emit, "abc");
  EXPECT_EQ(empty_only.Flush(), "");
}

TEST(StopMatcher, EmptyPieces) {
  StopMatcher m({"ab"});
  EXPECT_EQ(m.Push("").emit, "");
  EXPECT_EQ(m.Push("a").emit, "");
  EXPECT_EQ(m.Push("").emit, "");
  EXPECT_TRUE(m.Push("b").stopped);
}

TEST(StopMatcher, SelfOverlappingStopString) {
  // "aab" after "aaa": the automaton must fall back to "aa", not restart.
  StopMatcher m({"aab"});
  const Streamed run = Feed(m, {"xaa", "a", "ab"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.text, "xaa");
}

TEST(StopMatcher, MultiByteUtf8Stop) {
  StopMatcher m({"\xE3\x80\x82"});  // U+3002 IDEOGRAPHIC FULL STOP
  const Streamed run = Feed(m, {"\xE4\xBD\xA0\xE5\xA5\xBD", "\xE3\x80", "\x82\xE5\x90\x97"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.text, "\xE4\xBD\xA0\xE5\xA5\xBD");
}

TEST(StopMatcher, ResultDoesNotDependOnHowTextIsCut) {
  // Small alphabet so stop strings and partial overlaps are frequent.
  std::mt19937 gen(21);
  std::uniform_int_distribution<int> letter(0, 2);
  std::uniform_int_distribution<int> len(1, 4);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<std::string> stops(1 + trial % 3);
    for (std::string& s : stops) {
      for (int i = len(gen); i > 0; --i) s += static_cast<char>('a' + letter(gen));
    }
    std::string text;
    for (int i = 0; i < 30; ++i) text += static_cast<char>('a' + letter(gen) + (i % 7 == 0 ? 3 : 0));
    std::vector<std::string> pieces;
    for (size_t pos = 0; pos < text.size();) {
      const size_t n = std::min<size_t>(text.size() - pos, std::uniform_int_distribution<size_t>(0, 5)(gen));
      pieces.push_back(text.substr(pos, n));
      pos += n;
    }
    size_t longest = 0;
    for (const std::string& s : stops) longest = std::max(longest, s.size());
    StopMatcher m(stops);
    Streamed got;
    for (const std::string& piece : pieces) {
      const StopResult r = m.Push(piece);
      got.text += r.emit;
      got.stopped = r.stopped;
      if (r.stopped) break;
      // Held text is never more than a stop string could still need.
      ASSERT_LT(m.held_bytes(), longest);
    }
    if (!got.stopped) got.text += m.Flush();
    const Streamed want = Reference(text, stops);
    ASSERT_EQ(got.text, want.text) << "trial " << trial << " text " << text;
    ASSERT_EQ(got.stopped, want.stopped) << "trial " << trial;
  }
}

}  // namespace
}  // namespace strata::runtime
