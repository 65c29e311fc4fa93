// SPDX-License-Identifier: Apache-2.0
// Short stories in the TinyStories style (the reference model was trained on
// such text), written for kdn's demo and benchmarks.
#pragma once

namespace kdn::refengine {

struct Story {
  const char* title;
  const char* text;
  const char* questions[2];  // follow-ups that reuse the story's KV
};

inline constexpr Story kStories[] = {
    {"The red kite",
     "Once upon a time, there was a little boy named Tom. Tom had a red kite. He loved to fly his kite in the park "
     "near his house. One windy day, Tom ran to the park with his mom. He held the string tight and the kite went up, "
     "up, up into the sky. Tom was very happy. Then a big gust of wind came and the kite flew into a tall tree. Tom "
     "was sad. He did not know what to do. His mom said, \"Don't worry, Tom. We can ask for help.\" They saw a kind "
     "man with a long ladder. The man climbed the ladder and got the kite down. Tom said, \"Thank you!\" The man "
     "smiled and said, \"You are welcome. Fly it far from the trees.\" Tom ran to an open field and his kite flew "
     "high again.",
     {" Tom learned that", " The next day, Tom"}},
    {"Lily and the kitten",
     "Lily was a girl who liked to help. One morning she heard a small sound in the garden. It was a little kitten "
     "under a bush. The kitten was wet and cold. Lily picked it up and took it inside. She gave the kitten some warm "
     "milk and a soft blanket. The kitten purred and closed its eyes. Lily's dad came into the room. \"Where did "
     "this kitten come from?\" he asked. Lily told him about the bush and the rain. Her dad smiled. \"You did a good "
     "thing, Lily. We must find its home.\" They made a sign with a picture of the kitten. The next day, an old lady "
     "knocked on the door. She was so happy to see her kitten. She gave Lily a big hug and a cookie.",
     {" Lily felt", " The old lady said"}},
    {"Ben's big boat",
     "Ben and his sister Sue liked to play by the lake. One day they found a big box. Ben had an idea. \"Let's make "
     "a boat!\" he said. They painted the box blue and made a sail from an old shirt. Sue found a stick to use as a "
     "pole. They pushed the boat to the water and climbed in. The boat floated! Ben and Sue laughed and waved at the "
     "ducks. But soon the box got soft and water came in. \"Oh no, our boat is sinking!\" said Sue. They jumped out "
     "and splashed back to the shore. They were wet, but they were not sad. They sat in the sun and laughed. Ben "
     "said, \"Next time we will make a boat from wood.\"",
     {" Ben and Sue", " That night, Sue"}},
};

}  // namespace kdn::refengine
