package imagesize

import "testing"

// BenchmarkRead is the header alone (no base64): what a size costs once the bytes are there.
func BenchmarkRead(b *testing.B) {
	for name, f := range map[string][]byte{"png": encodePNG(b, 640, 480), "jpeg-app": withAPP(encodeJPEG(b, 640, 480), 2),
		"gif": encodeGIF(b, 64, 64), "webp": webpExtended(640, 480)} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if _, err := Read(f); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
