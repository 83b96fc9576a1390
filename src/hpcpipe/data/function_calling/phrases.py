"""What the synthetic conversations say besides requests and calls: general questions and their
answers, preambles, thanks, clarifying questions, refusals and restatements (``{...}`` slots are
filled by ``generator.py``)."""

from __future__ import annotations

# ------------------------------------------------------------------------------------ chat without functions

QA = (
    (
        "What's the capital of Switzerland?",
        "The capital of Switzerland is Bern, although Zürich is its largest city.",
    ),
    (
        "Can you explain what photosynthesis is?",
        "Photosynthesis is how plants turn sunlight, water and carbon dioxide into glucose and oxygen. It "
        "happens mostly in the chloroplasts of leaf cells.",
    ),
    (
        "Who wrote 'One Hundred Years of Solitude'?",
        "'One Hundred Years of Solitude' was written by Gabriel García Márquez and published in 1967.",
    ),
    (
        "How do you say 'thank you' in Japanese?",
        "'Thank you' in Japanese is ありがとう (arigatō). A more polite form is ありがとうございます.",
    ),
    (
        "What does 'déjà vu' mean?",
        "'Déjà vu' is French for 'already seen': the feeling that you've lived the present moment before.",
    ),
    (
        "How many continents are there?",
        "There are seven: Africa, Antarctica, Asia, Australia, Europe, North America and South America.",
    ),
    (
        "Why is the sky blue?",
        "Sunlight scatters off air molecules, and blue light scatters much more than red (Rayleigh "
        "scattering), so the sky looks blue.",
    ),
    (
        "Who painted the Mona Lisa?",
        "Leonardo da Vinci painted the Mona Lisa in the early 1500s. It hangs in the Louvre in Paris.",
    ),
    ("What's the square root of 144?", "The square root of 144 is 12."),
    ("What's the tallest mountain in the world?", "Mount Everest, at 8,849 metres above sea level."),
    (
        "What's the plural of 'cactus'?",
        "Both 'cacti' and 'cactuses' are correct; 'cacti' is more common in writing.",
    ),
    (
        "Can you suggest a name for my new puppy?",
        "How about Biscuit, Luna, Miso or Pepper? Pick one that suits your puppy's personality!",
    ),
    ("How long does sunlight take to reach Earth?", "About 8 minutes and 20 seconds."),
    (
        "What's the difference between weather and climate?",
        "Weather is what the atmosphere does on a given day; climate is the average of that weather over "
        "decades.",
    ),
    ("Give me a synonym for 'happy'.", "Some synonyms for 'happy' are cheerful, joyful, content and glad."),
    (
        "Can you write a haiku about autumn?",
        "Crisp leaves drift and fall,\nthe maple's last red whisper —\nwind carries it home.",
    ),
)
PREAMBLES = ("Sure, one moment.", "Sure! Let me do that.", "On it.", "Okay, just a second.")
GREETINGS = ("", "", "Hi! ", "Hey, ", "Quick question: ", "Hello! ")
THANKS = ("Thanks!", "Thank you, that's really helpful.", "Great, thanks a lot!", "Perfect, merci!")
WELCOME = (
    "You're welcome! Let me know if there's anything else I can do.",
    "Happy to help! Anything else?",
    "My pleasure — just ask if you need anything else.",
)
SAME_FOR = (
    "Do the same for {values}.",
    "Then repeat that for {values}.",
    "And the same for {values}, please.",
    "Please also do it for {values}.",
)
CONNECTORS = ("Also, ", "And ", "In addition, ", "Oh, and ")
ASK_OPENERS = (
    "Can you help me {cap}?",
    "I need to {cap}.",
    "Hi, I'd like to {cap}.",
    "Could you {cap} for me?",
)
ASKS = ("Of course! Could you tell me {needs}?", "Sure, I can help with that. Please give me {needs}.")
REFUSALS = (
    "I'm sorry, but I can't {cap} — that's outside the functions I have. I can help you {listed} if you'd "
    "like.",
    "Unfortunately I'm not able to {cap}. My available functions only let me {listed}.",
    "I'm afraid I don't have a function to {cap}. I can, however, {listed}.",
)
# mix.restate: the reply first says what is wanted and what the listed functions do, then decides.
RESTATEMENT = "You'd like to {need}. The function{s} here can {listed}."
RESTATED_REFUSALS = (
    "That isn't one of them, so I can't help with it here.",
    "So I'm afraid I can't do that here.",
)
NO_ACCESS_REFUSALS = (
    "I'm sorry, but I can't {cap} because I don't have access to external functions or services. I'm happy "
    "to help with general questions, though.",
    "Unfortunately, I'm not able to {cap} — I have no access to external tools. Is there anything else I "
    "can help you with?",
)
