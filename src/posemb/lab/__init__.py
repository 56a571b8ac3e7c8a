"""Experiments that measure what each encoding does (see :mod:`posemb.lab.dog_bites_man`)."""
