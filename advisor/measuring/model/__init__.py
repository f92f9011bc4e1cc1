"""The model of a cell: a family's reference model or a user's, built (builder), adapted (LoRA, QLoRA), and the families."""
