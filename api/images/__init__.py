"""Images in requests: the floor every dialect stands on to take them (no dialect imports another).

A dialect's translation puts an ImageRef where an image was among a message's parts (refs.py); the route
then awaits take_images (resolve.py), which decodes, fetches (only where IMAGE_URL_FETCH allows), checks
and replaces each with the engine's canonical image part.
"""

from api.images.refs import ImageRef, check_image_role, message_content
from api.images.resolve import client_field, resolve_images, take_images

__all__ = ["ImageRef", "check_image_role", "client_field", "message_content", "resolve_images", "take_images"]
