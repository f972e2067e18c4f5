"""The vision path: images in a chat become rows of the language model's input embeddings.

Rank 0 alone holds the vision tower and projector (mlx-vlm's classes, engine/vision/families), runs them once per
image and gives each image's placeholder tokens ids of their own (engine/vision/ids.py); the features travel in the
plan with the request (Insert.images), and every rank's embedding layer reads them at those ids
(engine/vision/table.py), so the language model loads, shards and caches as mlx-lm's text model does.
"""
