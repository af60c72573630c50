"""Seeded, diverse training prompts composed from task types x topics, at no model cost.

Why: a 135M instruct target asked to write its own user turns (Magpie-style)
produces a narrow, repetitive prompt distribution, and sampling them costs
about half a second each on CPU. A drafter trained on that does not
generalise to what users ask. Composing prompts from a table of task types
(explain, compare, story, code, arithmetic, extraction, role play, advice,
reasoning...; single-turn: a follow-up turn would need the target's first
answer, generated first) and a table of topics gives broad coverage for free,
deterministically from a seed.

These tables are written independently of the shipped held-out benchmark
prompts (``eaglewire/bench_prompts/heldout.jsonl``); a test asserts that no
generated prompt is a near-copy of a held-out one.
"""

from __future__ import annotations

import random

from eaglewire.data.prompts import Conversation

TOPICS = [
    "volcanoes", "honeybees", "the moon landing", "black holes", "coral reefs", "electric cars", "the stock market",
    "climate change", "the human heart", "chess", "jazz music", "the Roman Empire", "ancient Egypt", "the internet",
    "machine learning", "recycling", "composting", "solar panels", "wind turbines", "earthquakes", "hurricanes",
    "the immune system", "DNA", "gravity", "magnets", "rainforests", "deserts", "penguins", "elephants", "octopuses",
    "coffee", "chocolate", "bread baking", "tea ceremonies", "the Olympic Games", "football", "basketball",
    "meditation", "public speaking", "time management", "budgeting", "credit cards", "renting an apartment",
    "learning a new language", "the French Revolution", "the Industrial Revolution", "democracy", "taxes",
    "inflation", "cryptography", "passwords", "cloud computing", "smartphones", "batteries", "nuclear power",
    "the periodic table", "chemical reactions", "the solar system", "Mars", "comets", "tides", "glaciers",
    "mountains", "rivers", "the ocean floor", "sharks", "dinosaurs", "fossils", "evolution", "genetics",
    "sleep", "nutrition", "vitamins", "running", "yoga", "gardening", "houseplants", "birds", "dogs", "cats",
    "horses", "architecture", "bridges", "skyscrapers", "trains", "airplanes", "sailing", "maps", "libraries",
    "museums", "photography", "painting", "poetry", "theater", "film making", "video games", "board games",
    "friendship", "kindness", "leadership", "teamwork", "remote work", "job interviews", "small businesses",
    "marketing", "customer service", "volunteering", "cities", "villages", "festivals", "weddings", "cooking pasta",
    "spices", "fermentation", "water purification", "electricity", "light bulbs", "telescopes", "microscopes",
    "robots", "3D printing", "social media", "newspapers", "the printing of money", "banks", "insurance",
    "the moon", "the seasons", "rainbows", "clouds", "snow", "forests", "wolves", "whales", "ants", "butterflies",
]

ROLES = [
    "a pirate", "a detective", "a museum guide", "a chef", "a space station commander", "a kindergarten teacher",
    "a park ranger", "a news reporter", "a personal trainer", "a travel agent", "a librarian", "a wizard",
    "a robot butler", "a sports coach", "a doctor", "a shopkeeper in a small village",
]

LANGS = ["Python", "JavaScript", "C", "Go", "Rust", "Java", "SQL", "Bash"]

CODE_TASKS = [
    "sorts a list of numbers without using the built-in sort", "counts the words in a text",
    "finds the largest number in a list", "checks whether a number is prime", "computes the factorial of n",
    "merges two sorted lists", "removes duplicates from a list", "converts Celsius to Fahrenheit",
    "reads a file and prints its lines in reverse order", "computes the Fibonacci numbers up to n",
    "validates an email address", "finds the most common character in a string", "flattens a nested list",
    "computes the average of a list", "implements binary search", "implements a simple stack",
]

TEMPLATES = {
    "explain": ["Explain {t} to a ten-year-old.", "How does {t} work?", "What is the most surprising fact about {t}?",
                "Give me a short introduction to {t}.", "What are common misconceptions about {t}?",
                "Explain the history of {t} in a few paragraphs."],
    "list": ["List {n} interesting facts about {t}.", "Give {n} tips for someone new to {t}.",
             "What are {n} advantages and {n} disadvantages of {t}?", "Name {n} questions a student might ask about {t}."],
    "compare": ["Compare {t} and {u}.", "What do {t} and {u} have in common?", "Which is more important, {t} or {u}? Argue both sides."],
    "creative": ["Write a short poem about {t}.", "Write a story for children about {t}.", "Write a limerick about {t}.",
                 "Write a diary entry from someone who just discovered {t}.", "Write a dialogue between two friends arguing about {t}.",
                 "Write a blog post introduction about {t}."],
    "roleplay": ["You are {r}. Tell me about {t}.", "Pretend to be {r} and give a short speech about {t}.",
                 "Act as {r}. A visitor asks you about {t}. Answer in character."],
    "advice": ["I want to learn about {t}. Where should I start?", "How can {t} improve my daily life?",
               "My friend is worried about {t}. What should I tell them?", "Make a one-week plan to get started with {t}."],
    "code": ["Implement, in {l}, a routine that {c}.", "In {l}, how would you write a program that {c}? Explain each step.",
             "Show me {l} code that {c}, and a test for it."],
    "math": ["What is {a} times {b}? Show your work.", "What is {a} plus {b} minus {c2}?",
             "If a shop sells {a} apples a day, how many does it sell in {b} days?",
             "A recipe needs {a} grams of flour for {c2} people. How much is needed for {b} people?",
             "What is {p} percent of {a}?", "Solve the equation {c2}x + {a} = {b}.",
             "A car drives {a} kilometers at {c2} kilometers per hour. How long does the trip take?"],
    "reason": ["Is it true that {t} always matter more than {u}? Think step by step.",
               "What would happen if {t} disappeared tomorrow? Reason it through.",
               "Give a logical argument for and against spending more public money on {t}."],
    "extract": ["Summarize in two sentences: {fact}", "List every noun in this sentence: {fact}",
                "Turn this into a question and answer it: {fact}", "Rewrite this more formally: {fact}",
                "What is the main idea of this text? {fact}"],
}

FACTS = [
    "The community garden opened in April, and by summer forty families were growing tomatoes, beans and herbs there.",
    "Our team shipped the new app version on Monday, but users reported that the login button was hard to find.",
    "The old bridge will close for repairs from May to September, so buses will take the river road instead.",
    "Last winter the village library started lending tools, and the most borrowed item was a ladder.",
    "The company grew from three employees to sixty in four years, mostly by selling handmade furniture online.",
    "Scientists counted fewer frogs in the lake this year, possibly because the spring was unusually dry.",
    "The school choir practised every Thursday and won second prize at the regional competition in March.",
    "A new bakery on the corner sells sourdough bread, cinnamon rolls and coffee, and it opens at six in the morning.",
]


def _fill(tpl: str, rng: random.Random) -> str:
    t, u = rng.sample(TOPICS, 2)
    a, b = rng.randint(12, 480), rng.randint(3, 96)
    return tpl.format(t=t, u=u, r=rng.choice(ROLES), l=rng.choice(LANGS), c=rng.choice(CODE_TASKS),
                      n=rng.choice([3, 4, 5, 6]), a=a, b=b, c2=rng.randint(2, 12), p=rng.choice([5, 10, 15, 20, 25, 40]),
                      fact=rng.choice(FACTS))


def topic_prompts(n: int, seed: int = 0) -> list[Conversation]:
    """`n` distinct single-turn prompts, task types drawn round-robin so every category is covered."""
    rng = random.Random(seed)
    kinds = sorted(TEMPLATES)
    seen: set[str] = set()
    out: list[Conversation] = []
    attempts = 0
    while len(out) < n and attempts < 50 * n + 100:
        attempts += 1
        kind = kinds[attempts % len(kinds)]  # round-robin; a saturated kind is skipped
        text = _fill(rng.choice(TEMPLATES[kind]), rng)
        if text in seen:
            continue
        seen.add(text)
        out.append(Conversation([{"role": "user", "content": text}]))
    return out
