"""The tests' data: ../shared/data when it is there, else a corpus generated here, never a skip.

``data_root()`` is a directory laid out like ../shared/data (``multi30k/``, ``wmt14/``,
``wmt_sample/``) with the same file names and line counts. Set ``XF_TEST_DATA`` to use another
such directory, and ``MULTI30K_DIR`` for Multi30k alone. Where a file is missing, the whole tree
is generated (about a second): Multi30k-like image captions in English, German and French, made
from a small bilingual lexicon and a caption grammar, plus made-up place names so that a 2,000
piece BPE has enough to learn. The sentences are word-for-word rather than grammatical German or
French, but aligned, learnable and seeded: the same on every run. ``pytest``'s header says which
data the run used.
"""

from __future__ import annotations

import atexit
import functools
import os
import random
import shutil
import tempfile
from pathlib import Path

SHARED = (Path(__file__).resolve().parents[1] / ".." / "shared" / "data").resolve()
LANGS = ("en", "de", "fr")
# file -> line count, as in ../shared/data
LAYOUT = {
    **{f"multi30k/{split}.{lang}": n for split, n in (("train", 29000), ("val", 1014), ("test2016", 1000))
       for lang in LANGS},
    **{f"wmt14/newstest2013.en-{tgt}.{lang}": 3000 for tgt in ("de", "fr") for lang in ("en", tgt)},
    **{f"wmt_sample/news-commentary.en-fr.{lang}": 5000 for lang in ("en", "fr")},
}

# (en, de, fr)
PEOPLE = [
    ("man", "Mann", "homme"), ("woman", "Frau", "femme"), ("boy", "Junge", "garçon"),
    ("girl", "Mädchen", "fille"), ("child", "Kind", "enfant"), ("worker", "Arbeiter", "ouvrier"),
    ("musician", "Musiker", "musicien"), ("cyclist", "Radfahrer", "cycliste"), ("player", "Spieler", "joueur"),
    ("tourist", "Tourist", "touriste"), ("police officer", "Polizist", "policier"), ("chef", "Koch", "cuisinier"),
    ("farmer", "Bauer", "fermier"), ("student", "Student", "étudiant"), ("teacher", "Lehrer", "professeur"),
    ("doctor", "Arzt", "médecin"), ("dancer", "Tänzer", "danseur"), ("singer", "Sänger", "chanteur"),
    ("climber", "Kletterer", "grimpeur"), ("skier", "Skifahrer", "skieur"), ("surfer", "Surfer", "surfeur"),
    ("fisherman", "Fischer", "pêcheur"), ("baby", "Baby", "bébé"), ("dog", "Hund", "chien"),
    ("cat", "Katze", "chat"), ("horse", "Pferd", "cheval"), ("soldier", "Soldat", "soldat"),
    ("painter", "Maler", "peintre"), ("runner", "Läufer", "coureur"), ("vendor", "Verkäufer", "vendeur"),
    ("swimmer", "Schwimmer", "nageur"), ("guitarist", "Gitarrist", "guitariste"), ("photographer", "Fotograf", "photographe"),
]
ADJECTIVES = [
    ("young", "junger", "jeune"), ("old", "alter", "vieux"), ("tall", "großer", "grand"),
    ("small", "kleiner", "petit"), ("happy", "fröhlicher", "heureux"), ("tired", "müder", "fatigué"),
    ("smiling", "lächelnder", "souriant"), ("blond", "blonder", "blond"), ("bearded", "bärtiger", "barbu"),
    ("elderly", "älterer", "âgé"), ("busy", "beschäftigter", "occupé"), ("curious", "neugieriger", "curieux"),
]
COLORS = [
    ("red", "roten", "rouge"), ("blue", "blauen", "bleu"), ("green", "grünen", "vert"),
    ("black", "schwarzen", "noir"), ("white", "weißen", "blanc"), ("yellow", "gelben", "jaune"),
    ("orange", "orangen", "orange"), ("pink", "rosa", "rose"), ("gray", "grauen", "gris"),
    ("brown", "braunen", "marron"), ("purple", "lila", "violet"), ("striped", "gestreiften", "rayé"),
]
CLOTHES = [
    ("shirt", "Hemd", "chemise"), ("jacket", "Jacke", "veste"), ("hat", "Hut", "chapeau"),
    ("dress", "Kleid", "robe"), ("helmet", "Helm", "casque"), ("sweater", "Pullover", "pull"),
    ("coat", "Mantel", "manteau"), ("uniform", "Uniform", "uniforme"), ("scarf", "Schal", "écharpe"),
    ("apron", "Schürze", "tablier"), ("costume", "Kostüm", "costume"), ("t-shirt", "T-Shirt", "tee-shirt"),
]
ACTIONS = [
    ("is riding a bike", "fährt Fahrrad", "fait du vélo"), ("is playing the guitar", "spielt Gitarre", "joue de la guitare"),
    ("is reading a newspaper", "liest eine Zeitung", "lit un journal"), ("is eating an apple", "isst einen Apfel", "mange une pomme"),
    ("is jumping into the water", "springt ins Wasser", "saute dans l'eau"), ("is climbing a rock", "klettert auf einen Felsen", "escalade un rocher"),
    ("is selling vegetables", "verkauft Gemüse", "vend des légumes"), ("is cooking dinner", "kocht das Abendessen", "prépare le dîner"),
    ("is throwing a ball", "wirft einen Ball", "lance un ballon"), ("is walking a dog", "führt einen Hund aus", "promène un chien"),
    ("is painting a wall", "streicht eine Wand", "peint un mur"), ("is carrying a box", "trägt eine Kiste", "porte une boîte"),
    ("is talking on the phone", "telefoniert", "parle au téléphone"), ("is taking a picture", "macht ein Foto", "prend une photo"),
    ("is sitting on a bench", "sitzt auf einer Bank", "est assis sur un banc"), ("is waiting for the bus", "wartet auf den Bus", "attend le bus"),
    ("is running down the street", "läuft die Straße entlang", "court dans la rue"), ("is drinking coffee", "trinkt Kaffee", "boit du café"),
    ("is fixing a car", "repariert ein Auto", "répare une voiture"), ("is dancing with friends", "tanzt mit Freunden", "danse avec des amis"),
    ("is sleeping", "schläft", "dort"), ("is laughing", "lacht", "rit"), ("is singing a song", "singt ein Lied", "chante une chanson"),
    ("is kicking a soccer ball", "schießt einen Fußball", "frappe un ballon de football"),
    ("is pushing a stroller", "schiebt einen Kinderwagen", "pousse une poussette"),
    ("is holding an umbrella", "hält einen Regenschirm", "tient un parapluie"),
]
PLACES = [
    ("in the park", "im Park", "dans le parc"), ("on the beach", "am Strand", "sur la plage"),
    ("in the snow", "im Schnee", "dans la neige"), ("on a busy street", "auf einer belebten Straße", "dans une rue animée"),
    ("in front of a building", "vor einem Gebäude", "devant un bâtiment"), ("near the river", "in der Nähe des Flusses", "près de la rivière"),
    ("at the market", "auf dem Markt", "au marché"), ("in a kitchen", "in einer Küche", "dans une cuisine"),
    ("on a stage", "auf einer Bühne", "sur une scène"), ("in the forest", "im Wald", "dans la forêt"),
    ("on a bridge", "auf einer Brücke", "sur un pont"), ("at the train station", "am Bahnhof", "à la gare"),
    ("in a field", "auf einem Feld", "dans un champ"), ("on the mountain", "auf dem Berg", "sur la montagne"),
    ("in the rain", "im Regen", "sous la pluie"), ("outside a cafe", "vor einem Café", "devant un café"),
]
EXTRA = ("und im Hintergrund stehen viele große alte Gebäude mit hellen Fenstern und Balkonen",
         "et à l'arrière-plan se trouvent de nombreux grands bâtiments anciens avec des fenêtres claires")
SYLLABLES = ["ka", "lo", "mer", "vin", "ta", "ros", "bel", "dun", "sa", "ri", "hol", "gen", "por", "tiv", "anz",
             "el", "mo", "ruk", "sel", "bra", "nov", "ost", "qui", "zel", "fa", "dor", "lu", "wes", "kri", "pan"]


def place_name(rng: random.Random) -> str:
    return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4))).capitalize()


def caption(rng: random.Random, towns: list[str]) -> tuple[str, str, str]:
    """One aligned (en, de, fr) caption."""
    who, adj, color, cloth = rng.choice(PEOPLE), rng.choice(ADJECTIVES), rng.choice(COLORS), rng.choice(CLOTHES)
    act, place = rng.choice(ACTIONS), rng.choice(PLACES)
    en = ["An" if adj[0][0] in "aeiou" else "A", adj[0], who[0]]
    de = ["Ein", adj[1], who[1]]
    fr = ["Un", who[2], adj[2]]
    if rng.random() < 0.5:
        en += ["in a", color[0], cloth[0]]
        de += ["in einem", color[1], cloth[1]]
        fr += ["en", cloth[2], color[2]]
    en += [act[0], place[0]]
    de += [act[1], place[1]]
    fr += [act[2], place[2]]
    if rng.random() < 0.4:
        town = rng.choice(towns)
        en += ["in", town]
        de += ["in", town]
        fr += ["à", town]
    return " ".join(en) + " .", " ".join(de) + " .", " ".join(fr) + " ."


def write_corpus(root: Path, seed: int = 1) -> None:
    """The layout of LAYOUT, generated: each file pair (triple) aligned line by line."""
    rng = random.Random(seed)
    towns = sorted({place_name(rng) for _ in range(6000)})
    groups: dict[str, dict[str, int]] = {}
    for name, count in LAYOUT.items():
        stem, lang = name.rsplit(".", 1)
        groups.setdefault(stem, {})[lang] = count
    for stem, langs in sorted(groups.items()):
        count = next(iter(langs.values()))
        lines = {lang: [] for lang in LANGS}
        for _ in range(count):
            en, de, fr = caption(rng, towns)
            if stem.endswith("train") and rng.random() < 0.02:  # loose translations: cleaning drops some
                de, fr = f"{de[:-2]} {EXTRA[0]} .", f"{fr[:-2]} {EXTRA[1]} ."
            for lang, text in zip(LANGS, (en, de, fr)):
                lines[lang].append(text)
        for lang in langs:
            path = root / f"{stem}.{lang}"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(lines[lang]) + "\n", encoding="utf-8")


def _complete(root: Path, prefix: str = "") -> bool:
    return all((root / name[len(prefix):]).is_file() for name in LAYOUT if name.startswith(prefix))


@functools.lru_cache(maxsize=None)
def generated() -> Path:
    root = Path(tempfile.mkdtemp(prefix="xf-test-data-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    write_corpus(root)
    return root


def data_root() -> tuple[Path, str]:
    """The data directory (XF_TEST_DATA, else ../shared/data, else generated) and a line saying
    which it is."""
    root = Path(os.environ.get("XF_TEST_DATA", SHARED))
    if _complete(root):
        return root, f"{root} (Multi30k and WMT14 samples)"
    return generated(), f"a corpus generated in {generated()} ({root} is missing or incomplete)"


def multi30k() -> tuple[Path, str]:
    """The Multi30k directory (MULTI30K_DIR, else data_root()'s) and a line saying which it is."""
    if "MULTI30K_DIR" not in os.environ:
        root, line = data_root()
        return root / "multi30k", line
    path = Path(os.environ["MULTI30K_DIR"])
    if _complete(path, "multi30k/"):
        return path, f"Multi30k from MULTI30K_DIR={path}"
    return generated() / "multi30k", f"a Multi30k-like corpus generated in {generated()} (MULTI30K_DIR={path} is missing or incomplete)"
