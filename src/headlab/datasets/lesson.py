"""The lesson's sentence and the word every view opens on: where "prepared" sends its attention
shows, head by head, that heads look for different things (its subject "chef", its object
"fish", the words beside it). Its gold parse is ``samples/lesson.conllu``."""

LESSON_SENTENCE = "The chef who trained in Paris prepared the fish carefully."
LESSON_WORD = "prepared"
