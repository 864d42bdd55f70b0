#include <string>

#include <gtest/gtest.h>

#include "sha256.h"

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(forge::sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(forge::sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(forge::sha256_hex(two_blocks.data(), two_blocks.size()), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, StreamingEqualsOneShot) {
  std::string a(1000000, 'a');
  forge::Sha256 s;
  for (size_t i = 0; i < a.size(); i += 777) s.update(a.data() + i, std::min<size_t>(777, a.size() - i));
  EXPECT_EQ(s.hexdigest(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}
