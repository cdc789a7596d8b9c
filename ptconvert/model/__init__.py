"""Models in memory: example inputs, model specs (factories, Hugging Face directories), the
wrappers that give a model a plain calling convention, and eager modules built from weights."""
