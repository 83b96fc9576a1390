"""Function-calling conversations for LoRA fine-tuning (recipe lora-function-calling).

formats (Glaive v2, OpenAI, Hermes rows -> ``Conversation``, defined in conversation) -> tokens
(chat template, supervised-token masks) -> pack (several conversations per sequence) -> prepare
(the hash-named prepared dataset) -> loader; generator writes realistic Glaive v2 rows from the
tool schemas in ``schemas.json``.
"""
