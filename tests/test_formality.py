"""formality.py: how a German sentence addresses its reader, trap by trap."""

import pytest

from xformer_cli.text.formality import classify, cues, words


@pytest.mark.parametrize("text, label", [
    # plain cues
    ("Hast du Zeit?", "informal"),
    ("Ich gebe dir das Buch.", "informal"),
    ("Ist das dein Auto?", "informal"),
    ("Ich habe euch gesehen.", "informal"),
    ("Das ist euer Haus.", "informal"),
    ("Haben Sie Zeit?", "formal"),
    ("Ich danke Ihnen.", "formal"),
    ("Ist das Ihr Auto?", "formal"),
    ("Wie war Ihre Reise?", "formal"),
    ("Danke, dass Sie gekommen sind!", "formal"),
    ("Ich komme Ihretwegen.", "formal"),
    ("Das Wetter ist schön.", "none"),
    ("", "none"),
    # lowercase sie, ihr, ihnen: she, they, her, their
    ("Ich weiß, dass sie kommt.", "none"),
    ("Ich habe ihnen geholfen.", "none"),
    ("Er gibt ihr ihr Buch zurück.", "none"),
    ("Ich gehe mit ihr ins Kino.", "none"),
    ("Es tut ihr leid.", "none"),
    ("Ich habe ihr gesagt, dass es regnet.", "none"),
    # sentence-initial Sie: the verb decides
    ("Sie ist müde.", "none"),
    ("Sie hat einen Hund.", "none"),
    ("Sie kommt morgen.", "none"),
    ("Sie wuchs in Budapest auf.", "none"),
    ("Sie sagte nichts.", "none"),
    ("Sie sind müde.", "none"),  # you or they: ambiguous, and no source to ask
    ("Sie haben recht.", "none"),
    ("Sie in den Park mitnehmen, das wäre schön.", "none"),  # them, no verb beside it
    ("Sie sind müde, und Ihr Zug fährt gleich.", "formal"),  # mid-sentence Ihr decides
    # after a full stop, a colon or an opening quote a word is sentence-initial
    ("Tom ist hier. Sie ist auch hier.", "none"),
    ("Er sagte: Sie ist krank.", "none"),
    ("Er fragte: „Sie ist krank?“", "none"),
    ("Er fragte: „Kommen Sie mit?“", "formal"),
    # sentence-initial Ihr: you (plural) by the verb, else Your/Her/Their
    ("Ihr seid spät.", "informal"),
    ("Ihr habt recht.", "informal"),
    ("Seid still!", "informal"),
    ("Habt ihr Hunger?", "informal"),
    ("Ihr Hund ist groß.", "none"),  # Your, Her or Their dog
    ("Ihre Mutter ist nett.", "none"),
    ("Ihnen gehört das Haus.", "none"),
    ("Ihr kommt zu spät.", "none"),  # ambiguous without a source: kommt may be she's
    # quoted speech: cues count; outside the quotes they win a conflict
    ("„Du bist dran“, sagte er.", "informal"),
    ("Wie Sie wissen, sagte er immer: „Du schaffst das.“", "formal"),
    ("Er sagte „Du bist dran“, und sie sagte „Sie sind dran“.", "informal"),
    ("Hast du gesehen, wie Sie das gemacht haben?", "none"),  # both outside quotes: no telling
    # apostrophes are no quotes
    ("Wie geht’s dir?", "informal"),
    # addresses no one
    ("Du meine Güte! Wie spät es ist.", "none"),
    ("Du meine Güte! Mögen Sie Jazz?", "formal"),
    ("Auf dem Schild steht \"PORT DU CASQUE OBLIGATOIRE\".", "none"),
])
def test_classify(text, label):
    assert classify(text) == label


@pytest.mark.parametrize("text, source, label", [
    ("Sie sind müde.", "You are tired.", "formal"),
    ("Sie sind müde.", "They are tired.", "none"),
    ("Sie sind müde.", "I know.", "none"),
    ("Sie haben recht, und ich sage es ihnen.", "You are right, and I tell them.", "none"),  # both: no telling
    ("Ihr Hund ist groß.", "Your dog is big.", "formal"),
    ("Ihr Hund ist groß.", "Her dog is big.", "none"),
    ("Ihr kommt zu spät.", "You are late.", "informal"),
    ("Kennt ihr sie?", "Do you know her?", "none"),  # her: the source says both
    ("Kennt ihr Tom?", "Do you know Tom?", "informal"),
    ("Ich möchte, dass ihr das macht.", "I want you to do it.", "informal"),
    ("Der Hut steht ihr perfekt.", "The hat suits her perfectly.", "none"),
    # the source is asked only where the German is ambiguous
    ("Haben Sie Zeit?", "Have they got time?", "formal"),
    ("Sie ist müde.", "You are tired.", "none"),
])
def test_the_source_decides_only_ambiguous_sentences(text, source, label):
    assert classify(text, source) == label


def test_cues_name_their_words_and_positions():
    found = cues("Sie sind nett. Haben Sie Ihren Schirm?")
    assert [(c.word, c.start, c.formality, c.ambiguous) for c in found] == [
        ("Sie", 0, "formal", True), ("Sie", 21, "formal", False), ("Ihren", 25, "formal", False)]


def test_words_know_sentence_starts_quotes_and_neighbours():
    ws = words("Ja. „Sie, bitte“ sagte er")
    assert [(w.text, w.initial, w.quoted, w.attached) for w in ws] == [
        ("Ja", True, False, False), ("Sie", True, True, False), ("bitte", False, True, False),
        ("sagte", True, False, False), ("er", False, False, True)]
