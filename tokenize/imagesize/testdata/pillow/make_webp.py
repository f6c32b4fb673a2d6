# Writes the corpus's WebP files with Pillow's encoder (Go has none): run once, files committed.
# python3 make_webp.py DIR
import io, struct, sys
from PIL import Image

d = sys.argv[1]
Image.new("RGB", (300, 200), (10, 20, 30)).save(f"{d}/webp_lossy_300x200.webp", "WEBP")
Image.new("RGBA", (28, 28), (1, 2, 3, 4)).save(f"{d}/webp_lossless_rgba_28.webp", "WEBP", lossless=True)
Image.new("RGB", (1, 1)).save(f"{d}/webp_1x1.webp", "WEBP", lossless=True)
frames = [Image.new("RGB", (64, 48), (i * 60, 0, 0)) for i in range(3)]
frames[0].save(f"{d}/webp_animated_64x48.webp", "WEBP", save_all=True, append_images=frames[1:], duration=50)
ex = Image.Exif()
ex[0x0112] = 6
Image.new("RGB", (90, 30)).save(f"{d}/webp_exif_orientation6.webp", "WEBP", exif=ex.tobytes())
# A still VP8X whose canvas (28×28) differs from its frame (300×200): libwebp's demuxer refuses it.
b = io.BytesIO()
Image.new("RGB", (300, 200)).save(b, "WEBP", lossless=True)
w = b.getvalue()
vp8x = b"VP8X" + struct.pack("<I", 10) + bytes(4) + struct.pack("<I", 27)[:3] + struct.pack("<I", 27)[:3]
body = b"WEBP" + vp8x + w[12:]
open(f"{d}/webp_canvas_smaller_than_frame.webp", "wb").write(b"RIFF" + struct.pack("<I", len(body)) + body)
