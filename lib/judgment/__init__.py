"""Judgment and behavioral answers, with the arithmetic under them: decisions priced by their
reversibility, plans as dated timelines, queues made visible, adoption measured, theses computed."""
