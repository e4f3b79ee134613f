package mounts

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
)

// s3Backend is an S3 bucket (AWS or any S3-compatible server) through
// aws-sdk-go-v2. The keys it is given are relative to the mount's prefix.
type s3Backend struct {
	client   *s3.Client
	bucket   string
	prefix   string
	kmsKey   string
	partSize int64 // objects larger are uploaded in parts of (at least) this size
}

// S3 multipart limits: parts of at least 5 MiB (but the last), at most
// 10,000 of them.
const (
	minPartSize     = 5 << 20
	maxParts        = 10000
	defaultPartSize = 64 << 20
)

func newS3Backend(cfg *S3, creds aws.CredentialsProvider, hc *http.Client, partSize int64) *s3Backend {
	client := s3.New(s3.Options{
		Region:       cfg.Region,
		BaseEndpoint: aws.String(cfg.EndpointURL),
		UsePathStyle: cfg.PathStyle,
		Credentials:  creds,
		HTTPClient:   hc,
		// S3-compatible servers vary in the checksums they know; send
		// and check them only where S3 requires them.
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
		RetryMaxAttempts:           3,
	})
	return &s3Backend{client: client, bucket: cfg.Bucket, prefix: cfg.Prefix, kmsKey: cfg.KMSKey, partSize: max(partSize, minPartSize)}
}

var _ Backend = (*s3Backend)(nil)

func (b *s3Backend) List(ctx context.Context, prefix string) ([]Object, []string, error) {
	var objs []Object
	var dirs []string
	err := b.pages(ctx, prefix, "/", func(out *s3.ListObjectsV2Output) {
		for _, o := range out.Contents {
			objs = append(objs, b.object(o))
		}
		for _, p := range out.CommonPrefixes {
			dirs = append(dirs, strings.TrimPrefix(aws.ToString(p.Prefix), b.prefix))
		}
	})
	return objs, dirs, err
}

func (b *s3Backend) ListAll(ctx context.Context, prefix string) ([]Object, error) {
	var objs []Object
	err := b.pages(ctx, prefix, "", func(out *s3.ListObjectsV2Output) {
		for _, o := range out.Contents {
			objs = append(objs, b.object(o))
		}
	})
	return objs, err
}

func (b *s3Backend) pages(ctx context.Context, prefix, delim string, each func(*s3.ListObjectsV2Output)) error {
	in := &s3.ListObjectsV2Input{Bucket: &b.bucket, Prefix: aws.String(b.prefix + prefix)}
	if delim != "" {
		in.Delimiter = aws.String(delim)
	}
	p := s3.NewListObjectsV2Paginator(b.client, in)
	for p.HasMorePages() {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		out, err := p.NextPage(cctx)
		cancel()
		if err != nil {
			return s3Err("list "+prefix, err)
		}
		each(out)
	}
	return nil
}

func (b *s3Backend) object(o types.Object) Object {
	return Object{Key: strings.TrimPrefix(aws.ToString(o.Key), b.prefix), Size: aws.ToInt64(o.Size),
		ModTime: aws.ToTime(o.LastModified), ETag: aws.ToString(o.ETag)}
}

func (b *s3Backend) Stat(ctx context.Context, key string) (Object, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	out, err := b.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &b.bucket, Key: aws.String(b.prefix + key)})
	if err != nil {
		return Object{}, s3Err("stat "+key, err)
	}
	return Object{Key: key, Size: aws.ToInt64(out.ContentLength), ModTime: aws.ToTime(out.LastModified), ETag: aws.ToString(out.ETag)}, nil
}

func (b *s3Backend) Get(ctx context.Context, key string, off int64, w io.Writer) error {
	ctx, p := withProgress(ctx)
	defer p.done()
	in := &s3.GetObjectInput{Bucket: &b.bucket, Key: aws.String(b.prefix + key)}
	if off > 0 {
		in.Range = aws.String(fmt.Sprintf("bytes=%d-", off))
	}
	out, err := b.client.GetObject(ctx, in)
	if err != nil {
		return s3Err("get "+key, err)
	}
	defer out.Body.Close()
	if _, err := io.Copy(progressWriter{w, p}, out.Body); err != nil {
		return fmt.Errorf("get %s: %w", key, err)
	}
	return nil
}

// Put stores r in one request up to partSize, else as a multipart upload
// (a single PUT takes at most 5 GiB).
func (b *s3Backend) Put(ctx context.Context, key string, r io.ReaderAt, size int64) error {
	ctx, p := withProgress(ctx)
	defer p.done()
	if size > b.partSize {
		return b.putParts(ctx, p, key, r, size)
	}
	in := &s3.PutObjectInput{Bucket: &b.bucket, Key: aws.String(b.prefix + key), Body: progressReader{io.NewSectionReader(r, 0, size), p}, ContentLength: aws.Int64(size)}
	if b.kmsKey != "" {
		in.ServerSideEncryption = types.ServerSideEncryptionAwsKms
		in.SSEKMSKeyId = aws.String(b.kmsKey)
	}
	_, err := b.client.PutObject(ctx, in)
	return s3Err("put "+key, err)
}

// putParts uploads r as parts of partSize (more if 10,000 would not hold
// it), one after another; a failed upload is aborted so its parts do not
// linger (and bill) on the store.
func (b *s3Backend) putParts(ctx context.Context, p *progress, key string, r io.ReaderAt, size int64) error {
	part := max(b.partSize, (size+maxParts-1)/maxParts)
	in := &s3.CreateMultipartUploadInput{Bucket: &b.bucket, Key: aws.String(b.prefix + key)}
	if b.kmsKey != "" {
		in.ServerSideEncryption = types.ServerSideEncryptionAwsKms
		in.SSEKMSKeyId = aws.String(b.kmsKey)
	}
	up, err := b.client.CreateMultipartUpload(ctx, in)
	if err != nil {
		return s3Err("put "+key, err)
	}
	var done []types.CompletedPart
	for off, n := int64(0), int32(1); off < size; off, n = off+part, n+1 {
		length := min(part, size-off)
		out, err := b.client.UploadPart(ctx, &s3.UploadPartInput{Bucket: &b.bucket, Key: in.Key, UploadId: up.UploadId, PartNumber: aws.Int32(n),
			Body: progressReader{io.NewSectionReader(r, off, length), p}, ContentLength: aws.Int64(length)})
		if err != nil {
			return errors.Join(s3Err(fmt.Sprintf("put %s: part %d", key, n), err), b.abort(ctx, in.Key, up.UploadId))
		}
		done = append(done, types.CompletedPart{ETag: out.ETag, PartNumber: aws.Int32(n)})
	}
	_, err = b.client.CompleteMultipartUpload(ctx, &s3.CompleteMultipartUploadInput{Bucket: &b.bucket, Key: in.Key, UploadId: up.UploadId,
		MultipartUpload: &types.CompletedMultipartUpload{Parts: done}})
	if err != nil {
		return errors.Join(s3Err("put "+key+": complete", err), b.abort(ctx, in.Key, up.UploadId))
	}
	return nil
}

// abort ends a failed multipart upload, even once ctx is done.
func (b *s3Backend) abort(ctx context.Context, key, id *string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
	defer cancel()
	_, err := b.client.AbortMultipartUpload(ctx, &s3.AbortMultipartUploadInput{Bucket: &b.bucket, Key: key, UploadId: id})
	return s3Err("abort the multipart upload of "+aws.ToString(key), err)
}

func (b *s3Backend) Copy(ctx context.Context, src, dst string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*callTimeout)
	defer cancel()
	source := b.bucket + "/" + url.PathEscape(b.prefix+src)
	source = strings.ReplaceAll(source, "%2F", "/")
	in := &s3.CopyObjectInput{Bucket: &b.bucket, Key: aws.String(b.prefix + dst), CopySource: aws.String(source)}
	if b.kmsKey != "" {
		in.ServerSideEncryption = types.ServerSideEncryptionAwsKms
		in.SSEKMSKeyId = aws.String(b.kmsKey)
	}
	_, err := b.client.CopyObject(ctx, in)
	return s3Err("copy "+src+" to "+dst, err)
}

func (b *s3Backend) Delete(ctx context.Context, key string) error {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	_, err := b.client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &b.bucket, Key: aws.String(b.prefix + key)})
	if err := s3Err("delete "+key, err); err != nil && !errors.Is(err, errNotFound) {
		return err
	}
	return nil
}

// s3Err wraps err from op with the kind the file system maps to an errno.
func s3Err(op string, err error) error {
	if err == nil {
		return nil
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		switch ae.ErrorCode() {
		case "NoSuchKey", "NotFound", "NoSuchBucket":
			return fmt.Errorf("s3 %s: %w (%s)", op, errNotFound, ae.ErrorMessage())
		case "AccessDenied", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled":
			return fmt.Errorf("s3 %s: %w: %s: %s", op, errDenied, ae.ErrorCode(), ae.ErrorMessage())
		}
	}
	var re interface{ HTTPStatusCode() int }
	if errors.As(err, &re) {
		switch re.HTTPStatusCode() {
		case http.StatusNotFound:
			return fmt.Errorf("s3 %s: %w", op, errNotFound)
		case http.StatusForbidden:
			return fmt.Errorf("s3 %s: %w: %v", op, errDenied, err)
		}
	}
	return fmt.Errorf("s3 %s: %w", op, err)
}
