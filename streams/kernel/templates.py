"""WhatsApp message templates as both ends of the pipeline see them.

A *template intent* (``message_type`` ``template``) carries the Cloud API's template
object (``{"name", "language": {"code"}, "components": [...]}``, validated by
:func:`connectors.outbox.rules.check_template`) in
:attr:`~streams.kernel.contract.IntentCaptured.template`; a *text* intent may carry one
there too, as its **fallback**: the template sent instead of the text when Meta answers
that the customer-service window is closed (:class:`WindowClosed`, error 131047).

Only a gateway whose client says ``sends_templates = True`` (Meta's Cloud API) can send
one; the job processor fails a template intent on any other gateway before calling it.

The errors below are :class:`~streams.kernel.errors.PermanentGatewayError` subclasses, so
a caller that does not know them treats them as permanent (which they are, for this
message); the job processor knows them: a template's own fault never counts towards the
instance's :class:`~streams.instance_pauses.PermanentStreaks` (a bad template is not a bad
configuration of the number), a paused template holds its jobs
(:mod:`streams.template_pauses`), and a closed window sends the fallback template.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from streams.kernel.errors import PermanentGatewayError

TEMPLATE = "template"
"""The ``message_type`` (and payload ``type``) of a template intent."""
TEXT = "text"


def template_name(template: Mapping[str, Any]) -> str:
    name = template.get("name")
    return name if isinstance(name, str) else "?"


def template_language(template: Mapping[str, Any]) -> str:
    """The language code, whether given as ``{"code": "pt_BR"}`` or as ``"pt_BR"``."""
    language = template.get("language")
    if isinstance(language, Mapping):
        language = language.get("code")
    return language if isinstance(language, str) else "?"


def template_key(template: Mapping[str, Any]) -> str:
    """``name/language``: what Meta approves, pauses and disables, and what a pause holds."""
    return f"{template_name(template)}/{template_language(template)}"


def template_summary(template: Mapping[str, Any]) -> str:
    """The ``text`` of a template intent: what it is, without its parameters (which may be
    personal data: a name, a code, an amount)."""
    return f"[template {template_key(template)}]"


class TemplateRejected(PermanentGatewayError):
    """Meta refused the template of this message (132000 parameter count, 132001 unknown
    template or language, 132005 text too long, 132007 policy, 132012 parameter format,
    132016 disabled): the same template fails the same way; nothing was sent."""

    def __init__(self, message: str, *, code: int, status_code: int | None = None) -> None:
        super().__init__(message, status_code=status_code)
        self.code = str(code)


class TemplatePaused(TemplateRejected):
    """132015: Meta paused the template for its quality (3 hours the first time, 6 the
    second; a third time disables it, 132016). Nothing was sent. The job processor holds
    the template's jobs and re-checks it (:mod:`streams.template_pauses`)."""


class WindowClosed(PermanentGatewayError):
    """131047 answered to a send: more than 24 hours since the customer last wrote, so
    free text cannot be sent. A definite non-send (Meta refused the request; no message
    id). A text intent with a fallback template is sent as that template instead."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message, status_code=status_code)
        self.code = "131047"
