"""How a German sentence addresses its reader: ``formal`` (Sie), ``informal`` (du, ihr) or
``none`` (no one, or no telling), by rules over pronouns and verb forms. Torch-free.

What counts (a *cue*; ``cues(text)`` lists them):

- informal, in any case: du, dich, dir, dein*, euch, euer/eure*, and the verb forms only the
  second person plural has (seid, habt, könnt, gebt, ...: "Seid still!" has no pronoun);
- formal: Sie, Ihnen, Ihr, Ihre* capitalized inside a sentence ("Haben Sie", "dass Sie",
  "mit Ihrem"); lowercase they are she, they, her or their.

Ambiguous cues, where a pronoun may as well be she, they or their:

- a sentence's first word is capitalized anyway (so is the first after a colon or an opening
  quotation mark, which start a sentence here), so "Sie" first is read by its verb: third person
  singular ("Sie ist", "Sie hat", "Sie kommt", "Sie wuchs") is she, no cue; plural ("Sie sind",
  "Sie haben") is you or they, an ambiguous formal cue; anything else ("Sie in den Park
  mitnehmen", "Sie, die ...") no cue. "Ihre*" and "Ihnen" first are ambiguous formal cues, and
  so is "Ihr" first before a noun ("Ihr Hund": Your, Her or Their dog);
- "ihr" (or "Ihr" first) is her or their ("ich gebe ihr ihr Buch", "zu ihr") unless a verb
  that may be the second person plural's stands beside it: "ihr kommt", "kennt ihr", "dass
  ihr das macht" are ambiguous informal cues, as the verb in -t may be she's ("ihr fehlt": she
  lacks); "ihr seid" leaves the cue to the verb.

Quoted speech is text the writer chose a form of address for, so its cues count; only where a
sentence holds formal and informal cues at once do those outside quotes decide (a narrator who
says Sie quoting someone who says du is formal). "Du meine Güte" and its kind address no one, nor
does a word in capitals ("PORT DU CASQUE OBLIGATOIRE").

How a sentence is labelled (``classify``): its unambiguous cues decide (formal and informal both:
those outside quotes, else ``none``); where it has ambiguous cues only, all of one formality, the
English ``source`` decides when one is given (you and no she, her, they, them or their: that
formality), and without a source, or when it says both or neither, the sentence is ``none``.
This rule favours precision: a "they" taken for formal would teach a tagged model that Sie means
they (``xf preprocess --formality-tags`` leaves ``none`` untagged). Imperatives with no pronoun
("Komm!", "Hab Spaß") carry no cue. bench/formality_classifier.py measures the rules on CoCoA-MT.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

LANGUAGE = "de"  # the language the classifier reads
FORMALITIES = ("formal", "informal")  # what a request may ask for
LABELS = FORMALITIES + ("none",)

INFORMAL_WORDS = frozenset("du dich dir dein deine deinen deinem deiner deines deins euch euer eure euren eurem "
                           "eurer eures euere deinetwegen euretwegen deinerseits eurerseits deinesgleichen "
                           "euresgleichen".split())
POLITE_WORDS = frozenset("Sie Ihnen Ihr Ihre Ihren Ihrem Ihrer Ihres Ihretwegen Ihrerseits "
                         "Ihresgleichen".split())  # capitalized: formal mid-sentence
# Second person plural forms no other person has (``kommt`` is also he/she comes, ``tut`` also
# she does: "es tut ihr leid"): each is a cue by itself, "ihr" left out or not (Seid still!)
SECOND_PLURAL = frozenset(
    "seid habt wart hattet wollt wolltet könnt konntet könntet dürft durftet dürftet müsst musstet müsstet sollt "
    "solltet wisst wusstet werdet wurdet würdet mögt mochtet möchtet wärt wäret hättet tatet gebt nehmt sprecht "
    "helft seht lest esst trefft werft vergesst schlaft lauft tragt haltet lasst fangt brecht empfehlt".split())
PLURAL = frozenset({"sind"})  # plural forms that end in neither -en nor -n
# Third person singular forms that end in neither -t nor -n: the past of strong verbs and the modals
THIRD_SINGULAR = frozenset(
    "ist war wird kann will muss darf soll mag weiß sei habe werde möge ging kam sah gab nahm lag saß stand fand "
    "las lief rief schrieb blieb schlief trank aß sprach traf fiel hielt ließ trug fuhr sang zog starb half hieß "
    "wuchs bat bot flog fing hing schwamm".split())
# Words that end like a verb (-t, -n) and are none: what may follow "Sie" or "ihr" without being its verb
NOT_VERBS = frozenset(
    "nicht nichts jetzt erst fast selbst oft mit gut bereits sonst meist zuerst zunächst längst recht schlecht "
    "kalt heiß leicht bekannt bunt echt halt seit bis schon denn dann wann wenn wegen einen den in an von ihn "
    "ihnen man nun zusammen morgen gestern oben unten neben hinten vorn allein ein kein keinen ihren ihrem "
    "sein seinen unseren meinen deinen gern ebenfalls eben stets bisschen etwas einst zumindest mindestens "
    "meistens spät bereit verrückt total nett laut wert perfekt unbedingt bestimmt sofort genug jemandem "
    "leid".split())
# Before "ihr" these make it her (zu ihr, mit ihr), never the subject
PREPOSITIONS = frozenset("zu mit bei von aus nach seit gegenüber außer an auf in hinter neben über unter vor "
                         "zwischen entgegen dank gemäß samt nebst".split())
# Conjunctions after which "ihr" may open a clause whose verb comes last (dass ihr das macht)
CONJUNCTIONS = frozenset("dass ob wenn weil als da damit obwohl bevor nachdem bis sobald solange während falls "
                         "wie wo was warum ehe seit".split())
INTERJECTIONS = re.compile(r"\bdu (meine güte|lieber himmel|liebe zeit|lieber gott|meine nerven)\b", re.IGNORECASE)
SENTENCE_END = ".!?…:;"
QUOTES = "„‚“”‘’«»‹›\""
OPENING_ONLY = "„‚"  # German low quotes open; the others open outside a quote and close inside one
ADDRESS_EN = re.compile(r"\b(you|your|yours|yourself|yourselves|y'all)\b", re.IGNORECASE)
THIRD_EN = re.compile(r"\b(she|her|hers|herself|they|them|their|theirs|themselves)\b", re.IGNORECASE)
TOKEN = re.compile(rf"[^\W\d_]+|[{re.escape(SENTENCE_END + QUOTES)}]|[^\w\s]")


@dataclass(frozen=True)
class Cue:
    """One word that says how the sentence addresses its reader: ``formality`` formal or informal;
    ``ambiguous``: it may as well be she, they or their (decided by ``classify``'s rule);
    ``quoted``: inside quotation marks."""

    word: str
    start: int  # character offset in the text
    formality: str
    ambiguous: bool = False
    quoted: bool = False


@dataclass(frozen=True)
class Word:
    text: str
    start: int
    initial: bool  # first of its sentence: start of text, after . ! ? … : ; or a quotation mark
    quoted: bool
    attached: bool  # no punctuation between it and the word before (a verb beside its subject)


def words(text: str) -> list[Word]:
    """The words of ``text`` (runs of letters), each with where it stands."""
    out: list[Word] = []
    initial, quoted, attached = True, False, False
    for m in TOKEN.finditer(text):
        token, at = m.group(), m.start()
        if token[0].isalpha():
            out.append(Word(token, at, initial, quoted, attached))
            initial, attached = False, True
            continue
        if token in QUOTES and text[at - 1: at].isalpha() and text[at + 1: at + 2].isalpha():
            continue  # an apostrophe: geht’s, Bloomingdale‘s
        if token in QUOTES:
            quoted = True if token in OPENING_ONLY else not quoted
            initial = True
        elif token in SENTENCE_END:
            initial = True
        attached = False  # other punctuation (commas, dashes, brackets) only parts the words
    return out


def verb_form(w: str) -> Optional[str]:
    """What a lowercase word says of the person of its subject, were it a finite verb:
    "singular" (third person: she), "plural" (you formal, or they), "second_plural" (ihr),
    "t" (kommt: she comes, or ihr: you come), or None (no verb, or no telling)."""
    if w in NOT_VERBS:
        return None
    if w in SECOND_PLURAL:
        return "second_plural"
    if w in THIRD_SINGULAR:
        return "singular"
    if w in PLURAL or w.endswith("n"):  # sind, haben, gehen, tun, gingen
        return "plural"
    if w.endswith("t") and not (w.startswith("ge") and len(w) > 5):  # kommt, sagtet; not gesagt
        return "t"
    if w.endswith("te"):  # sagte, spielte: the weak past's singular
        return "singular"
    return None


def verb_after(word: Optional[Word]) -> Optional[str]:
    """``verb_form`` of the word right after a subject pronoun: None where it is not right after
    it (a comma between) or is capitalized (a noun: "Ihr Hund")."""
    if word is None or not word.attached or not word.text.islower():
        return None
    return verb_form(word.text)


def is_verb_t(word: Optional[Word]) -> bool:
    """A word that may be a verb of the second person plural: it ends in -t, and is no adverb."""
    return word is not None and verb_form(word.text.lower()) in ("second_plural", "t")


def verb_last(ws: list[Word], i: int) -> bool:
    """Whether the clause of word ``i`` (up to the next punctuation) goes on past the word after
    it, no noun next to it, and ends in a verb that may be ihr's (dass ihr das macht)."""
    end = i
    while end + 1 < len(ws) and ws[end + 1].attached:
        end += 1
    return end > i + 1 and not ws[i + 1].text[0].isupper() and is_verb_t(ws[end])


def cues(text: str) -> list[Cue]:
    """The words of ``text`` that say how it addresses its reader, in order (module docstring)."""
    ws = words(INTERJECTIONS.sub(lambda m: "x" * len(m.group()), text))  # "Du meine Güte!" addresses no one
    out: list[Cue] = []
    for i, w in enumerate(ws):
        after = ws[i + 1] if i + 1 < len(ws) else None
        before = ws[i - 1] if i > 0 and w.attached else None  # the word just before, in the same clause
        lower = w.text.lower()
        if len(w.text) > 1 and w.text.isupper():
            continue  # capitals: a sign or a name ("PORT DU CASQUE"), not a sentence's address

        def cue(formality: str, ambiguous: bool = False) -> None:
            out.append(Cue(text[w.start: w.start + len(w.text)], w.start, formality, ambiguous, w.quoted))

        if lower in INFORMAL_WORDS or (lower in SECOND_PLURAL and (w.text.islower() or w.initial)):
            cue("informal")
        elif lower == "ihr" and (w.text == "ihr" or w.initial):  # ihr, or Ihr opening a sentence
            person = verb_after(after)
            if person == "second_plural" or (before is not None and before.text.lower() in PREPOSITIONS):
                pass  # ihr seid: the verb is the cue; zu ihr, mit ihr: her
            elif person == "t" or is_verb_t(before) or (
                    before is not None and before.text.lower() in CONJUNCTIONS and verb_last(ws, i)):
                cue("informal", ambiguous=True)  # ihr kommt, kennt ihr, dass ihr das macht; or she: ihr fehlt
            elif w.initial and after is not None and after.attached and person is None:
                cue("formal", ambiguous=True)  # Ihr Hund: Your, Her or Their dog
        elif w.text in POLITE_WORDS and not w.initial:
            cue("formal")
        elif w.text == "Sie":  # first in its sentence
            if verb_after(after) == "plural":
                cue("formal", ambiguous=True)  # Sie sind: you are, or they are
        elif w.text in POLITE_WORDS - {"Sie", "Ihr"}:  # Ihre, Ihnen, ... first in its sentence
            cue("formal", ambiguous=True)
    return out


def classify(text: str, source: Optional[str] = None) -> str:
    """``formal``, ``informal`` or ``none``: how the German ``text`` addresses its reader, by
    its cues; ``source``: the English it translates, read only where the German is ambiguous
    (module docstring)."""
    found = cues(text)
    sure = {c.formality for c in found if not c.ambiguous}
    if len(sure) == 2:
        sure = {c.formality for c in found if not c.ambiguous and not c.quoted}  # the narrator's own address
    if len(sure) == 1:
        return sure.pop()
    if sure or not found:
        return "none"
    readings = {c.formality for c in found}  # only ambiguous cues: Sie sind (you or they), Ihr Hund
    if len(readings) == 1 and source is not None and ADDRESS_EN.search(source) and not THIRD_EN.search(source):
        return readings.pop()
    return "none"
