# Expected Qwen2.5-VL image token counts for tokenize/vision's tests, computed with Hugging Face's
# own smart_resize: the function below is transformers' src/transformers/models/qwen2_vl/
# image_processing_qwen2_vl.py (huggingface/transformers at cb0fc56f3caccab77d00d44051a67d4b0980cbd2),
# unchanged; tokens = grid_h * grid_w / merge_size**2 with grid = resized // patch_size, as its
# _preprocess computes image_grid_thw and Qwen2VLProcessor expands <|image_pad|>.
# Run: python3 tokenize/vision/testdata/smart_resize_reference.py
import math


def smart_resize(
    height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 14 * 14 * 4 * 1280
):
    if height < factor or width < factor:
        raise ValueError(f"height:{height} or width:{width} must be larger than factor:{factor}")
    elif max(height, width) / min(height, width) > 200:
        raise ValueError(
            f"absolute aspect ratio must be smaller than 200, got {max(height, width) / min(height, width)}"
        )
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = math.floor(height / beta / factor) * factor
        w_bar = math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


# Qwen2.5-VL-7B-Instruct's preprocessor_config.json (testdata/qwen2_5_vl).
patch_size, merge_size, min_pixels, max_pixels = 14, 2, 3136, 12845056
# Also the min_pixels/max_pixels a deployment often sets (256*28*28, 1280*28*28).
small = (200704, 1003520)
sizes = [(28, 28), (42, 42), (70, 70), (56, 84), (100, 100), (224, 224), (640, 480), (480, 640),
         (1024, 768), (1920, 1080), (1080, 1920), (3840, 2160), (4000, 3000), (5000, 5000),
         (10000, 200), (200, 10000), (30, 5000), (1234, 567), (333, 777), (98, 126), (14, 14) ,
         (2048, 2048), (7, 1000), (60, 60), (4096, 64), (911, 1733)]
for w, h in sizes:
    for mn, mx in [(min_pixels, max_pixels), small]:
        try:
            rh, rw = smart_resize(h, w, factor=patch_size * merge_size, min_pixels=mn, max_pixels=mx)
            n = (rh // patch_size) * (rw // patch_size) // (merge_size ** 2)
            print(f"\t{{{w}, {h}, {mn}, {mx}, {rw}, {rh}, {n}}},")
        except ValueError as e:
            print(f"\t// {w}x{h} min {mn} max {mx}: {e}")

# Qwen3-VL: patch_size 16, merge_size 2, size {shortest_edge: 65536, longest_edge: 16777216}.
print("\t// Qwen3-VL (factor 32)")
for w, h in [(640, 480), (1920, 1080), (100, 100), (5000, 5000), (333, 777)]:
    rh, rw = smart_resize(h, w, factor=32, min_pixels=65536, max_pixels=16777216)
    print(f"\t{{{w}, {h}, {rw}, {rh}, {(rh // 16) * (rw // 16) // 4}}},")
