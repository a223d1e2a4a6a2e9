package app

import (
	"bufio"
	"context"
	"fmt"
	"io"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	restwatch "k8s.io/client-go/rest/watch"
)

// streamReadBuffer is how much of a stream is read per system call: a
// watch's events are a few hundred bytes each, and the framer reads each
// one's length and body separately.
const streamReadBuffer = 256 << 10

// restStream opens watches of resource (all namespaces, labelSelector)
// over rc, accepting contentType only, so that the response is known to
// be in it; its events are decoded as client-go decodes a watch's, but in
// the caller's goroutine.
func restStream(rc rest.Interface, resource, contentType, labelSelector string) openStream {
	return func(ctx context.Context, o metav1.ListOptions) (eventDecoder, error) {
		info, ok := runtime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), contentType)
		if !ok || info.StreamSerializer == nil {
			return nil, fmt.Errorf("no stream decoder for %s", contentType)
		}
		o.Watch = true
		o.LabelSelector = labelSelector
		body, err := rc.Get().Resource(resource).VersionedParams(&o, scheme.ParameterCodec).
			SetHeader("Accept", contentType).Stream(ctx)
		if err != nil {
			return nil, err
		}
		buffered := struct {
			io.Reader
			io.Closer
		}{bufio.NewReaderSize(body, streamReadBuffer), body}
		frames := info.StreamSerializer.Framer.NewFrameReader(buffered)
		objects := scheme.Codecs.WithoutConversion().DecoderToVersion(info.Serializer, nil)
		return restwatch.NewDecoder(streaming.NewDecoder(frames, info.StreamSerializer.Serializer), objects), nil
	}
}
