# Prints, for every file of a directory, what Pillow makes of it: the size Image.open reports,
# the size after ImageOps.exif_transpose would turn it (what a processor that applies EXIF orientation sees),
# and whether the pixels load (convert("RGB"), as processors do; not tried above 4096² pixels). JSON on stdout.
# python3 pillow_sizes.py DIR
import json, os, sys, warnings
from PIL import Image

warnings.simplefilter("ignore")
out = {}
d = sys.argv[1]
for name in sorted(os.listdir(d)):
    if name.endswith((".py", ".json")):
        continue
    r = {}
    try:
        im = Image.open(os.path.join(d, name))
        r["size"] = list(im.size)
        # exif_transpose's table: orientations 5-8 (transpose, rotate 270, transverse,
        # rotate 90) swap the sides. Read without loading the pixels (exif_transpose copies).
        o = im.getexif().get(0x0112, 1)
        r["transposed"] = list(im.size[::-1] if o in (5, 6, 7, 8) else im.size)
        if im.size[0] * im.size[1] > 4096 * 4096:
            r["load_skipped"] = True  # hundreds of MB of pixels: the size is what matters
            out[name] = r
            continue
        try:
            Image.open(os.path.join(d, name)).convert("RGB")
            r["loads"] = True
        except Exception as e:
            r["loads"] = False
            r["load_error"] = str(e)
    except Exception as e:
        r["error"] = str(e)
    out[name] = r
print(json.dumps(out, indent=1, sort_keys=True))
