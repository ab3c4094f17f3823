"""Text the bot sends to Slack is shown, never interpreted: answers come from the model, which quotes users and
tools, so `<!channel>`, `<!here>`, `<@U…>` or a link in them must not notify anyone or become markup.

Slack treats `&`, `<` and `>` as control characters and asks for them as `&amp;`, `&lt;`, `&gt;` in text that is
not meant as markup; that turns every `<!…>`/`<@…>`/`<#…>`/`<http…|…>` into plain text. A bare `@channel`,
`@here` or `@everyone` gets an invisible word joiner after the `@` so no client setting (`link_names`) turns it
into a broadcast. Both replacements are character-local, so a streamed text escaped piece by piece grows the same
way as the whole text escaped at once.
"""

from __future__ import annotations

import re

_BROADCAST = re.compile(r"@(?=(?:channel|here|everyone)\b)", re.IGNORECASE)
WORD_JOINER = "\u2060"


def slack_text(text: str) -> str:
    """`text` as Slack should show it, literally."""
    escaped = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _BROADCAST.sub("@" + WORD_JOINER, escaped)
