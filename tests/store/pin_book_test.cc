// SPDX-License-Identifier: Apache-2.0
// The pin book both registries of documents use (the knowledge index, kdnd's
// node): per key, a pin without a deadline wins, else the latest deadline;
// a key's pin goes with the last of its owners.
#include "core/store/pin_book.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace kdn::store {
namespace {

TEST(PinBook, NoDeadlineWinsElseTheLatest) {
  PinBook<std::string, std::int64_t> book;
  EXPECT_FALSE(book.Effective("a").has_value());
  book.Add("a", 300);
  book.Add("a", 100);
  EXPECT_EQ(book.Effective("a"), 300);
  book.Add("a", 0);  // a document pinned until unpinned
  EXPECT_EQ(book.Effective("a"), 0);
  book.Remove("a", 0);
  EXPECT_EQ(book.Effective("a"), 300);
  book.Remove("a", 300);
  EXPECT_EQ(book.Effective("a"), 100);
  book.Remove("a", 100);
  EXPECT_FALSE(book.Effective("a").has_value());
  EXPECT_FALSE(book.Pinned("a"));
  EXPECT_EQ(book.keys(), 0u);
}

TEST(PinBook, TwoOwnersOfOneDeadlineAreTwoPins) {
  PinBook<std::string, std::uint64_t> book;
  book.Add("k", 50);
  book.Add("k", 50);
  book.Remove("k", 50);
  EXPECT_EQ(book.Effective("k"), 50u);  // the other owner's pin holds
  book.Remove("k", 7);                  // no pin with that deadline: nothing
  EXPECT_EQ(book.Effective("k"), 50u);
  book.Remove("k", 50);
  EXPECT_FALSE(book.Pinned("k"));
  book.Add("x", 1);
  book.Add("y", 2);
  size_t seen = 0;
  book.ForEachKey([&](const std::string&) { ++seen; });
  EXPECT_EQ(seen, 2u);
  book.Clear();
  EXPECT_EQ(book.keys(), 0u);
}

}  // namespace
}  // namespace kdn::store
