module github.com/ferrykit/ferry

go 1.26.0

require (
	github.com/google/uuid v1.6.0
	github.com/klauspost/compress v1.20.4
	github.com/pierrec/lz4/v4 v4.1.33
	github.com/twmb/franz-go v1.22.3
	github.com/twmb/franz-go/pkg/kadm v1.20.0
	github.com/twmb/franz-go/pkg/kmsg v1.15.1
)
